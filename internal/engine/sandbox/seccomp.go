package sandbox

import (
	"encoding/json"
	goruntime "runtime"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Errno values returned by the seccomp profile.
const (
	errnoEPERM  = 1  // explicitly forbidden: the attack surface we close
	errnoENOSYS = 38 // unknown to the profile: libc and runtimes fall back
)

// denied are system calls user code never needs and that attacks use. They
// get EPERM so a test (or a curious user) sees a deliberate refusal. Most are
// also refused for lack of capabilities; seccomp makes the refusal not
// depend on that, and closes the ones an unprivileged process may call
// (io_uring, userfaultfd, perf_event_open, keyctl, unshare of a user
// namespace, ptrace of a sibling, memfd exec).
var denied = []string{
	// io_uring: a large, frequently exploited kernel surface that bypasses
	// per-syscall filtering. Docker 20.10's default profile still allows it.
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// Kernel programming, introspection and exploitation helpers.
	"bpf", "userfaultfd", "perf_event_open", "lookup_dcookie",
	// Kernel keyrings are shared across containers of the same uid.
	"keyctl", "add_key", "request_key",
	// Replacing or stopping the kernel, loading modules.
	"kexec_load", "kexec_file_load", "reboot",
	"init_module", "finit_module", "delete_module",
	// Changing the filesystem view or joining/creating namespaces.
	"mount", "umount2", "mount_setattr", "move_mount", "open_tree",
	"fsopen", "fsconfig", "fsmount", "fspick", "pivot_root", "chroot",
	"unshare", "setns",
	// Reading or writing other processes.
	"ptrace", "process_vm_readv", "process_vm_writev", "process_madvise",
	"pidfd_getfd", "kcmp",
	// The clock is the host's.
	"clock_settime", "clock_adjtime", "adjtimex", "settimeofday",
	// Host administration.
	"swapon", "swapoff", "acct", "syslog", "quotactl", "vhangup",
	"sethostname", "setdomainname", "iopl", "ioperm", "modify_ldt",
	"open_by_handle_at", "name_to_handle_at", "fanotify_init",
	"mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
	// Anonymous executable files would sidestep the noexec /tmp.
	"memfd_create", "memfd_secret",
}

// allowed are the system calls Python, Node.js, Bash and the usual Unix
// tools need, without arguments filtered. Anything not listed here or in
// denied returns ENOSYS, so newer system calls are refused until reviewed.
var allowed = []string{
	// Files and directories.
	"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
	"preadv2", "pwritev2", "lseek", "open", "openat", "openat2", "creat", "close",
	"close_range", "dup", "dup2", "dup3", "pipe", "pipe2", "access", "faccessat",
	"faccessat2", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
	"getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir",
	"unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
	"symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod", "fchmodat",
	"chown", "fchown", "lchown", "fchownat", "umask", "truncate", "ftruncate",
	"fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs",
	"sync_file_range", "utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat",
	"sendfile", "splice", "tee", "vmsplice", "copy_file_range", "fcntl", "flock",
	"ioctl", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
	"flistxattr", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
	"lremovexattr", "fremovexattr", "inotify_init", "inotify_init1",
	"inotify_add_watch", "inotify_rm_watch",
	// Memory.
	"brk", "mmap", "munmap", "mprotect", "mremap", "msync", "mincore", "madvise",
	"mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier",
	"pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages",
	// Processes, threads and signals (inside the sandbox's pid namespace).
	"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
	"kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigpending",
	"rt_sigsuspend", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
	"rt_sigreturn", "sigaltstack", "pause", "restart_syscall", "signalfd", "signalfd4",
	"pidfd_open", "pidfd_send_signal", "getpid", "getppid", "gettid", "getuid",
	"geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid", "getpgid",
	"getpgrp", "getsid", "setsid", "setpgid", "setuid", "setgid", "setreuid",
	"setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid",
	"capget", "capset", "prctl", "arch_prctl", "set_tid_address", "set_thread_area",
	"get_thread_area", "futex", "futex_waitv", "set_robust_list", "get_robust_list",
	"rseq", "seccomp", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
	"getpriority", "setpriority", "sched_yield", "sched_getaffinity",
	"sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
	"sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
	"sched_rr_get_interval", "sched_getattr", "sched_setattr", "ioprio_get",
	"ioprio_set", "getcpu", "landlock_create_ruleset", "landlock_add_rule",
	"landlock_restrict_self",
	// Time.
	"clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday",
	"time", "alarm", "getitimer", "setitimer", "timer_create", "timer_settime",
	"timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create",
	"timerfd_settime", "timerfd_gettime",
	// Waiting for events.
	"poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1",
	"epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
	// Sockets: creation is filtered by family below; the network namespace
	// has only a loopback interface.
	"socketpair", "connect", "bind", "listen", "accept", "accept4", "getsockname",
	"getpeername", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg",
	"recvmmsg", "shutdown", "setsockopt", "getsockopt",
	// System V and POSIX IPC (in the sandbox's own IPC namespace), aio.
	"shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
	"msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
	"mq_timedreceive", "mq_notify", "mq_getsetattr", "io_setup", "io_destroy",
	"io_submit", "io_cancel", "io_getevents", "io_pgetevents",
	// Information.
	"uname", "sysinfo", "getrandom",
}

// Socket address families user code may create: local, IPv4/IPv6 (which
// reach only the sandbox's loopback) and netlink (to list that loopback).
// Others are refused; AF_VSOCK in particular is not isolated by network
// namespaces and would reach the hypervisor of a virtual machine host.
var socketFamilies = []uint64{1 /* AF_UNIX */, 2 /* AF_INET */, 10 /* AF_INET6 */, 16 /* AF_NETLINK */}

// icmpProtocol is the ICMP protocol number of each IP family.
var icmpProtocol = map[uint64]uint64{2: 1 /* IPPROTO_ICMP */, 10: 58 /* IPPROTO_ICMPV6 */}

// Namespace flags clone must not carry: creating namespaces (a user
// namespace above all) is how most container escapes start.
const cloneNamespaceFlags = 0x00020000 | // CLONE_NEWNS
	0x02000000 | // CLONE_NEWCGROUP
	0x04000000 | // CLONE_NEWUTS
	0x08000000 | // CLONE_NEWIPC
	0x10000000 | // CLONE_NEWUSER
	0x20000000 | // CLONE_NEWPID
	0x40000000 // CLONE_NEWNET

// personalities are the execution domains user code may select (the
// default, 32-bit and UNAME26 variants, and the query); others enable
// legacy address-space layouts.
var personalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// Seccomp returns our seccomp profile as an OCI runtime-spec filter, adjusted
// for runtime ("crun", "runc", "runsc"; the docker driver passes the runtime
// Docker runs). The default action for anything not listed is ENOSYS.
func Seccomp(runtime string) *specs.LinuxSeccomp {
	enosys := uint(errnoENOSYS)
	eperm := uint(errnoEPERM)
	s := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &enosys,
		// Only the native 64-bit system call table: the 32-bit and x32
		// entry points do not match the filter and kill the calling
		// thread. (Each extra architecture also costs the runtime about
		// 4 ms of filter compilation per sandbox.)
		Architectures: nativeArch(),
	}
	allow := slices.Clone(allowed)
	// glibc (pthread_create, posix_spawn) falls back to clone when clone3
	// is unknown; clone3's flags live in memory seccomp cannot inspect.
	enosysNames := []string{"clone3"}
	if runtime == "runsc" {
		// gVisor 2022-12 applies the filter inside its own kernel but
		// ignores errnoRet: every refusal is EPERM, and glibc does not
		// fall back from clone3 on EPERM (threads could not start). Its
		// own clone3 returns ENOSYS, and namespaces created inside gVisor
		// stay inside gVisor, so clone3 is left to it.
		allow = append(allow, enosysNames...)
		enosysNames = nil
	}
	s.Syscalls = append(s.Syscalls,
		specs.LinuxSyscall{Names: allow, Action: specs.ActAllow},
		specs.LinuxSyscall{Names: slices.Clone(denied), Action: specs.ActErrno, ErrnoRet: &eperm},
		specs.LinuxSyscall{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
			{Index: 0, Value: cloneNamespaceFlags, ValueTwo: 0, Op: specs.OpMaskedEqual},
		}},
	)
	if len(enosysNames) > 0 {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: enosysNames, Action: specs.ActErrno, ErrnoRet: &enosys})
	}
	for _, f := range socketFamilies {
		args := []specs.LinuxSeccompArg{{Index: 0, Value: f, Op: specs.OpEqualTo}}
		if icmp, ok := icmpProtocol[f]; ok {
			// No ICMP "ping" sockets: the one way to send ICMP without
			// CAP_NET_RAW where the runtime allows it (gVisor does).
			args = append(args, specs.LinuxSeccompArg{Index: 2, Value: icmp, Op: specs.OpNotEqual})
		}
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow, Args: args})
	}
	for _, p := range personalities {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"personality"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: p, Op: specs.OpEqualTo}}})
	}
	return s
}

// nativeArch is the seccomp architecture of the host's own system calls.
func nativeArch() []specs.Arch {
	switch goruntime.GOARCH {
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64}
	default:
		return []specs.Arch{specs.ArchX86_64}
	}
}

// SeccompDockerJSON returns the profile in the JSON form Docker accepts for
// `--security-opt seccomp=...` (HostConfig.SecurityOpt). Docker's format
// shares the runtime-spec field names for everything the profile uses.
func SeccompDockerJSON(runtime string) ([]byte, error) {
	return json.Marshal(Seccomp(runtime))
}

// DeniedSyscalls lists the system calls the profile refuses with EPERM.
func DeniedSyscalls() []string { return slices.Clone(denied) }
