package engine

import (
	"context"
	"io"
	"time"
)

// Starter is the optional capability of a driver that starts sandboxes
// that stay (package sandboxes): one sandbox, many calls. A live sandbox
// has the walls of an execution's (no network, read-only root, its own
// uid, seccomp, no capabilities, the cgroup limits of LiveSpec.Limits
// over all its processes), and runs one process of its own, the agent
// (package agent), as the sandbox's uid. The host talks to the agent over
// Live.Conn; everything else (commands, files, saving the home) goes
// through that connection.
type Starter interface {
	Start(ctx context.Context, spec LiveSpec) (Live, error)
}

// HomeDir is the writable home of a live sandbox and the default working
// directory of its commands: a tmpfs of LiveSpec.HomeBytes, owned by the
// sandbox's uid, noexec, nosuid and nodev like /tmp (an interpreter still
// runs a script written there). CodeDir is not mounted in a live sandbox.
const HomeDir = "/home/user"

// OOM scores (oom_score_adj). A sandbox's processes start at
// SandboxOOMScore, so under host memory pressure the kernel takes
// sandboxes before the server or anything else on the host. In a live
// sandbox the agent forks what it starts (commands, context kernels) at
// CodeOOMScore, so the memory cgroup's OOM killer takes the code before
// the agent. Unprivileged code can lower its score only down to the
// sandbox's, never below the agent.
const (
	SandboxOOMScore = 900
	CodeOOMScore    = 1000
)

// AgentPath is where the agent binary (LiveSpec.Agent, mounted read-only)
// appears inside a live sandbox.
const AgentPath = "/.vertal/agent"

// LiveSpec is one sandbox that stays, as a driver sees it.
type LiveSpec struct {
	// ID names the sandbox ("sbx_<hex>"): bundle directory, container
	// name, cgroup, as Spec.ID does for an execution. Reap removes what a
	// crashed server left of live sandboxes too.
	ID string
	// Image is driver specific, as Language.Image: a root filesystem
	// directory for oci, an image reference for docker.
	Image string
	// Limits bound the whole sandbox. Limits.Lifetime is its hard
	// deadline from Start, kept inside the sandbox (sandbox.DeadlineArgv
	// around the agent): the plan's maximum lifetime, which no extension
	// passes. OutputBytes, WorkdirBytes, ReturnFiles and ReturnBytes are
	// per command or unused.
	Limits Limits
	// HomeBytes is the size of the HomeDir tmpfs.
	HomeBytes int64
	// Agent is the host path of the agent binary (a static executable),
	// bind-mounted read-only at AgentPath and run as
	// `AgentPath serve --deadline <unix seconds>`.
	Agent string
	// Deadline is the sandbox's current expiry, passed to the agent, which
	// ends every process at that time even when the server is gone; the
	// host moves it with the agent's SetDeadline.
	Deadline time.Time
	// EgressDir, if set, is a host directory bind-mounted read-only at
	// EgressDir (the constant) inside the sandbox. The server may later
	// listen on a unix socket in it (EgressSocket), the sandbox's only way
	// out (package egress); the agent relays 127.0.0.1:EgressPort to it.
	// Under runsc the driver lets the sandbox open host unix sockets
	// (--host-uds=open) for it.
	EgressDir string
}

// Where a live sandbox reaches the server's egress proxy: the directory
// (LiveSpec.EgressDir), the socket the server listens on in it, and the
// loopback port the agent relays to that socket inside the sandbox (the
// sandbox's HTTP_PROXY and HTTPS_PROXY).
const (
	EgressDir    = "/.vertal/net"
	EgressSocket = EgressDir + "/proxy.sock"
	EgressPort   = 3128
)

// Live is one started sandbox that stays.
type Live interface {
	// Conn is the agent's transport: its stdin (writes) and stdout
	// (reads). Closing it makes the agent end every process and exit.
	Conn() io.ReadWriteCloser
	// Done is closed when the sandbox's processes have all ended (the
	// agent exited, the deadline passed, an OOM kill, Discard).
	Done() <-chan struct{}
	// Usage is what the whole sandbox consumed so far (its cgroup): CPU
	// seconds, peak memory, and SandboxSeconds as the time since Start.
	Usage() Usage
	// MemoryBytes is the sandbox's current memory (cgroup usage); 0 if
	// unknown.
	MemoryBytes() int64
	// Discard kills every process and removes everything the sandbox left
	// on the host (bundle, cgroup, mounts, container). It is safe to call
	// more than once and after Done.
	Discard(ctx context.Context) error
}
