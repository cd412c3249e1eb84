package sandbox

import (
	"encoding/binary"
	goruntime "runtime"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
)

// Return values of a seccomp filter (linux/seccomp.h).
const (
	retEPERM  = retErrnoBase | errnoEPERM
	retENOSYS = retErrnoBase | errnoENOSYS
)

// seccompData is struct seccomp_data as the filter reads it. The BPF VM
// of golang.org/x/net/bpf loads 32-bit words in network byte order, so
// each word is written big-endian at its native offset: a 64-bit
// argument's low word first, as on little-endian x86_64.
func seccompData(auditArch uint32, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], auditArch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[16+8*i+4:], uint32(a>>32))
	}
	return b
}

// TestCompiledSeccompMatchesProfile runs the compiled filter in a BPF VM
// on every system call the profile names, and on the argument filters.
func TestCompiledSeccompMatchesProfile(t *testing.T) {
	if goruntime.GOARCH != "amd64" {
		t.Skip("the table below is x86_64's")
	}
	prog, err := seccompProgram(Seccomp("bwrap"))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	x86 := arch.X86_64
	nr := func(name string) uint32 {
		n, ok := x86.SyscallNames[name]
		if !ok {
			t.Fatalf("no system call %s", name)
		}
		return uint32(n)
	}
	run := func(data []byte) int {
		r, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, name := range allowed {
		if got := run(seccompData(uint32(x86.ID), nr(name))); got != retAllow {
			t.Errorf("%s: %#x, want allow", name, got)
		}
	}
	for _, name := range denied {
		if got := run(seccompData(uint32(x86.ID), nr(name))); got != retEPERM {
			t.Errorf("%s: %#x, want EPERM", name, got)
		}
	}
	const sigchld, cloneVM, cloneThread = 17, 0x100, 0x10000
	for _, tc := range []struct {
		name string
		data []byte
		want int
	}{
		{"clone3", seccompData(uint32(x86.ID), nr("clone3")), retENOSYS},
		{"unknown call", seccompData(uint32(x86.ID), 1000), retENOSYS},
		{"not in profile", seccompData(uint32(x86.ID), nr("lsm_get_self_attr")), retENOSYS},
		{"i386 entry point", seccompData(0x40000003, 1), retENOSYS},
		{"x32 entry point", seccompData(uint32(x86.ID), 0x40000000|nr("read")), retENOSYS},
		{"clone fork", seccompData(uint32(x86.ID), nr("clone"), sigchld), retAllow},
		{"clone thread", seccompData(uint32(x86.ID), nr("clone"), cloneVM|cloneThread|sigchld), retAllow},
		{"clone user namespace", seccompData(uint32(x86.ID), nr("clone"), 0x10000000|sigchld), retENOSYS},
		{"clone net namespace", seccompData(uint32(x86.ID), nr("clone"), 0x40000000), retENOSYS},
		{"clone mount namespace", seccompData(uint32(x86.ID), nr("clone"), 0x00020000), retENOSYS},
		{"socket unix", seccompData(uint32(x86.ID), nr("socket"), 1, 1, 0), retAllow},
		{"socket tcp", seccompData(uint32(x86.ID), nr("socket"), 2, 1, 0), retAllow},
		{"socket tcp6", seccompData(uint32(x86.ID), nr("socket"), 10, 1, 6), retAllow},
		{"socket netlink", seccompData(uint32(x86.ID), nr("socket"), 16, 3, 0), retAllow},
		{"socket icmp", seccompData(uint32(x86.ID), nr("socket"), 2, 2, 1), retENOSYS},
		{"socket icmpv6", seccompData(uint32(x86.ID), nr("socket"), 10, 2, 58), retENOSYS},
		{"socket vsock", seccompData(uint32(x86.ID), nr("socket"), 40, 1, 0), retENOSYS},
		{"socket packet", seccompData(uint32(x86.ID), nr("socket"), 17, 3, 0), retENOSYS},
		{"socket family high bits", seccompData(uint32(x86.ID), nr("socket"), 1<<32|2, 1, 0), retENOSYS},
		{"personality query", seccompData(uint32(x86.ID), nr("personality"), 0xffffffff), retAllow},
		{"personality linux32", seccompData(uint32(x86.ID), nr("personality"), 0x8), retAllow},
		{"personality no randomize", seccompData(uint32(x86.ID), nr("personality"), 0x0040000), retENOSYS},
	} {
		if got := run(tc.data); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

func TestCompileSeccompRefuses(t *testing.T) {
	enosys := uint(errnoENOSYS)
	base := func() *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &enosys, Architectures: nativeArch(),
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}
	}
	for _, tc := range []struct {
		name string
		edit func(*specs.LinuxSeccomp)
	}{
		{"nil", nil},
		{"foreign arch", func(s *specs.LinuxSeccomp) { s.Architectures = []specs.Arch{specs.ArchX86, specs.ArchX86_64} }},
		{"notify", func(s *specs.LinuxSeccomp) { s.Syscalls[0].Action = specs.ActNotify }},
		{"unknown call", func(s *specs.LinuxSeccomp) { s.Syscalls[0].Names = []string{"no_such_call"} }},
		{"masked equal nonzero", func(s *specs.LinuxSeccomp) {
			s.Syscalls[0].Args = []specs.LinuxSeccompArg{{Index: 0, Value: 3, ValueTwo: 1, Op: specs.OpMaskedEqual}}
		}},
		{"two actions", func(s *specs.LinuxSeccomp) {
			s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActErrno})
		}},
		{"flags", func(s *specs.LinuxSeccomp) { s.Flags = []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s *specs.LinuxSeccomp
			if tc.edit != nil {
				s = base()
				tc.edit(s)
			}
			if _, err := CompileSeccomp(s); err == nil {
				t.Errorf("CompileSeccomp accepted it")
			}
		})
	}
	if b, err := CompileSeccomp(base()); err != nil || len(b)%8 != 0 || len(b) == 0 {
		t.Errorf("CompileSeccomp(valid) = %d bytes, %v", len(b), err)
	}
}
