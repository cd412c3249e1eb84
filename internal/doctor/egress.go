package doctor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// The egress group (docs/SECURITY.md, "Egress"): which plans give their
// sandboxes that stay a network, and whether this host delivers it the
// way the server does (package sandboxes, network.go). The relay row
// starts a live sandbox through the driver's engine.Starter with a host
// directory mounted at engine.EgressDir, listens on engine.EgressSocket
// there as the server's proxy would, has the agent relay
// 127.0.0.1:engine.EgressPort to it, and runs a program inside that goes
// through the relay and also tries the one way the sandbox must not
// have: a route of its own.

// EgressOptions configure the egress group; Options.Egress nil leaves it
// out.
type EgressOptions struct {
	// Plans are the configured plans; the first row lists those whose
	// sandboxes may reach a network, with their allowlists.
	Plans map[string]config.Plan
	// Agent is the host path of the agent binary (LiveSpec.Agent); ""
	// skips the relay check, AgentErr saying why.
	Agent    string
	AgentErr error
	// Timeout bounds the relay check, start to discard. Default 2 minutes.
	Timeout time.Duration

	// connect speaks to a live sandbox's agent; nil is agent.NewClient.
	// Tests fake it.
	connect func(io.ReadWriteCloser) sandboxAgent
}

// sandboxAgent is what the relay check asks of a live sandbox's agent
// (*agent.Client).
type sandboxAgent interface {
	Ping(ctx context.Context) error
	Egress(ctx context.Context, socketPath string, port int) error
	Spawn(ctx context.Context, r agent.SpawnRequest) (agent.Process, error)
	Close() error
}

// The egress group's rows.
const (
	egressGroup     = "egress"
	egressPlansName = "plans with egress"
	egressRelayName = "egress relay"
)

// egressOKDetail is the relay row's detail when everything held.
const egressOKDetail = "relay through the agent to the host's proxy socket works; no other route"

// egressPlans is the first row: the plans that allow egress and their
// allowlists.
func egressPlans(plans map[string]config.Plan) Check {
	c := Check{Group: egressGroup, Name: egressPlansName, Status: StatusOK}
	var parts []string
	for _, name := range config.PlanNames(plans) {
		pol := plans[name].EgressPolicy()
		if !pol.Enabled() {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %s (%s in and out per sandbox)", name, strings.Join(pol.Strings(), ", "), mib(pol.MaxBytes)))
	}
	if len(parts) == 0 {
		c.Detail = "no plan allows egress (sandboxes have no network)"
	} else {
		c.Detail = strings.Join(parts, "; ")
	}
	return c
}

func anyEgress(plans map[string]config.Plan) bool {
	for _, p := range plans {
		if p.EgressPolicy().Enabled() {
			return true
		}
	}
	return false
}

func mib(n int64) string {
	if n <= 0 {
		return "no byte cap"
	}
	if n%(1<<20) == 0 {
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// egressChecks are the group's rows. skip, when set, is why the relay
// check cannot run (host only, no driver).
func egressChecks(ctx context.Context, opts Options, skip string) []Check {
	eo := opts.Egress
	rows := []Check{egressPlans(eo.Plans)}
	relay := Check{Group: egressGroup, Name: egressRelayName, Essential: anyEgress(eo.Plans)}
	starter, isStarter := opts.Driver.(engine.Starter)
	lang, hasPython := findLanguage(opts.Languages, "python")
	switch {
	case skip != "":
		relay.Status, relay.Detail = StatusSkipped, skip
	case !isStarter:
		relay.Status, relay.Detail = StatusSkipped, "the driver "+opts.Driver.Name()+" cannot start sandboxes that stay"
	case eo.Agent == "":
		relay.Status, relay.Detail = StatusSkipped, "no agent binary"
		if eo.AgentErr != nil {
			relay.Detail = eo.AgentErr.Error()
		}
	case !hasPython:
		relay.Status, relay.Detail = StatusSkipped, "language python is not configured"
	default:
		relay = checkRelay(ctx, opts, starter, lang.Image, relay)
	}
	return append(rows, relay)
}

func findLanguage(langs []engine.Language, name string) (engine.Language, bool) {
	i := slices.IndexFunc(langs, func(l engine.Language) bool { return l.Name == name })
	if i < 0 {
		return engine.Language{}, false
	}
	return langs[i], true
}

// egressLeak is a failure of the relay check that is a way out of the
// sandbox besides the relay: always essential.
type egressLeak struct{ msg string }

func (e *egressLeak) Error() string { return e.msg }

// checkRelay fills row with the outcome of the relay check.
func checkRelay(ctx context.Context, opts Options, starter engine.Starter, image string, row Check) Check {
	timeout := opts.Egress.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := proveRelay(ctx, opts, starter, image, timeout)
	var leak *egressLeak
	switch {
	case err == nil:
		row.Status, row.Detail = StatusOK, egressOKDetail
	case errors.As(err, &leak):
		row.Status, row.Detail, row.Essential = StatusFail, err.Error(), true
		row.Fix = "a sandbox must have loopback only (its own network namespace; runsc --network=none); do not give any plan egress until this passes"
	default:
		row.Status, row.Detail = StatusFail, err.Error()
		row.Fix = relayFix(opts.Driver.Name())
	}
	return row
}

// relayFix is how to make the relay work on driver (e.g. "docker/runsc").
func relayFix(driver string) string {
	switch {
	case driver == "docker/runsc":
		return "dockerd's runsc runtime needs --host-uds=open: rerun scripts/dockerd.sh"
	case probes.OnGVisor(driver):
		return "the oci driver runs runsc with --host-uds=open for the egress socket: use a runsc that supports it; vertal doctor --verbose logs the driver's errors"
	default:
		return "the sandbox's uid must reach the socket through the read-only mount at " + engine.EgressDir + "; vertal doctor --verbose shows the program's output"
	}
}

// proveRelay starts the sandbox, which lives at most lifetime, relays,
// runs the program and judges what it printed; it leaves nothing behind.
func proveRelay(ctx context.Context, opts Options, starter engine.Starter, image string, lifetime time.Duration) (err error) {
	dir, err := os.MkdirTemp("", "vertal-egress-")
	if err != nil {
		return fmt.Errorf("the egress directory: %w", err)
	}
	defer os.RemoveAll(dir)
	// The sandbox's uid passes through it (the mount keeps the mode).
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("the egress directory: %w", err)
	}
	spec := engine.LiveSpec{
		ID:        newSandboxID(),
		Image:     image,
		Limits:    engine.DefaultLimits(lifetime),
		HomeBytes: 16 << 20,
		Agent:     opts.Egress.Agent,
		Deadline:  time.Now().Add(lifetime),
		EgressDir: dir,
	}
	live, err := starter.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("starting a sandbox that stays with an egress directory: %w", err)
	}
	connect := opts.Egress.connect
	if connect == nil {
		connect = func(c io.ReadWriteCloser) sandboxAgent { return agent.NewClient(c) }
	}
	ag := connect(live.Conn())
	defer func() {
		ag.Close()
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if derr := live.Discard(dctx); derr != nil && err == nil {
			err = fmt.Errorf("discarding the sandbox: %w", derr)
		}
	}()
	if err := ag.Ping(ctx); err != nil {
		return fmt.Errorf("reaching the agent: %w", err)
	}

	// Listen after the start, as the server does when it hands a
	// sandbox over.
	echo, err := listenEcho(dir)
	if err != nil {
		return fmt.Errorf("the egress socket: %w", err)
	}
	defer echo.close()
	if err := ag.Egress(ctx, engine.EgressSocket, engine.EgressPort); err != nil {
		return fmt.Errorf("starting the agent's relay: %w", err)
	}
	out, errOut, code, err := runIn(ctx, ag, []string{"python3", "-c", relayProgram, strconv.Itoa(engine.EgressPort), echo.token})
	opts.Logger.Debug("doctor egress", "sandbox_id", spec.ID, "exit", code, "stdout", oneLine(out, 300), "stderr", oneLine(errOut, 300), "err", err)
	if err != nil {
		return fmt.Errorf("running the program in the sandbox: %w", err)
	}
	return judgeRelay(out, errOut, code, echo)
}

// relayProgram runs in the sandbox with the relay's port and a token as
// its arguments. It sends the token through the relay and reads what
// comes back until the host closes; connects straight to TEST-NET-1,
// which a sandbox without a route cannot even try (the kernel answers
// "network unreachable" and sends nothing); and lists the interfaces.
// It prints one JSON object.
const relayProgram = `
import errno, json, socket, sys
port, token = int(sys.argv[1]), sys.argv[2].encode()
out = {}
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(token)
    got = b""
    while len(got) < 4096:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    out["relay"] = got.decode("latin-1")
except OSError as e:
    out["relay_error"] = "%s: %s" % (type(e).__name__, e)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(("192.0.2.1", 80))
    out["direct"] = "connected"
except socket.timeout:
    out["direct"] = "timed out"
except ConnectionRefusedError:
    out["direct"] = "refused"
except OSError as e:
    out["direct"] = "%s (%s)" % (e.strerror, errno.errorcode.get(e.errno, e.errno))
    out["direct_errno"] = e.errno
s.close()
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
print(json.dumps(out))
`

// relayReport is what relayProgram prints.
type relayReport struct {
	Relay       *string  `json:"relay"`
	RelayError  string   `json:"relay_error"`
	Direct      string   `json:"direct"`
	DirectErrno int      `json:"direct_errno"`
	Interfaces  []string `json:"interfaces"`
}

// judgeRelay reads relayProgram's output: the echo server's answer came
// back, the direct connection failed without leaving the sandbox, and lo
// is the only interface. A way out besides the relay is an egressLeak,
// whatever the relay did (both are told).
func judgeRelay(stdout, stderr string, code int, echo *echoServer) error {
	var r relayReport
	if code != 0 || json.Unmarshal([]byte(strings.TrimSpace(stdout)), &r) != nil {
		return fmt.Errorf("the program in the sandbox failed (exit %d): %s", code, oneLine(stdout+stderr, 200))
	}
	var leaks []string
	if !slices.Equal(r.Interfaces, []string{"lo"}) {
		leaks = append(leaks, "the sandbox has interfaces besides lo: "+strings.Join(r.Interfaces, ", "))
	}
	// With lo alone nothing leaves on ENETUNREACH (no route; gVisor's
	// netstack says EHOSTUNREACH), EACCES or EPERM (refused in the
	// sandbox); a connection, a refusal or a timeout means a route.
	switch r.DirectErrno {
	case int(syscall.ENETUNREACH), int(syscall.EHOSTUNREACH), int(syscall.EACCES), int(syscall.EPERM):
	default:
		leaks = append(leaks, "a direct connection to 192.0.2.1:80 (TEST-NET-1) did not fail at once for want of a route: "+r.Direct)
	}
	var relay string
	switch {
	case r.RelayError != "":
		relay = fmt.Sprintf("connecting to 127.0.0.1:%d in the sandbox: %s (the host's socket was reached %d times)", engine.EgressPort, r.RelayError, echo.reached.Load())
	case r.Relay == nil || *r.Relay != echo.reply:
		got := "nothing"
		if r.Relay != nil && *r.Relay != "" {
			got = strconv.Quote(oneLine(*r.Relay, 80))
		}
		relay = fmt.Sprintf("through 127.0.0.1:%d the sandbox got %s back, not the host's answer (the host's socket was reached %d times, the token seen %d)",
			engine.EgressPort, got, echo.reached.Load(), echo.answered.Load())
	}
	switch {
	case len(leaks) > 0 && relay != "":
		return &egressLeak{strings.Join(leaks, "; ") + "; and " + relay}
	case len(leaks) > 0:
		return &egressLeak{strings.Join(leaks, "; ") + " (the relay works)"}
	case relay != "":
		return errors.New(relay)
	}
	return nil
}

// runIn runs argv in the sandbox and returns its output and exit code.
func runIn(ctx context.Context, ag sandboxAgent, argv []string) (stdout, stderr string, code int, err error) {
	p, err := ag.Spawn(ctx, agent.SpawnRequest{Argv: argv})
	if err != nil {
		return "", "", 0, err
	}
	var o, e strings.Builder
	for {
		select {
		case ev, ok := <-p.Events():
			if !ok {
				return o.String(), e.String(), 0, errors.New("the process ended without an exit")
			}
			switch ev.Stream {
			case 1:
				o.Write(ev.Data)
			case 2:
				e.Write(ev.Data)
			default:
				return o.String(), e.String(), ev.ExitCode, nil
			}
		case <-ctx.Done():
			p.Signal(context.Background(), syscall.SIGKILL)
			return o.String(), e.String(), 0, fmt.Errorf("the program did not end: %w", ctx.Err())
		}
	}
}

// echoServer stands in for the server's egress proxy on the socket: it
// reads the token and answers with a reply only the host knows, so that
// an answer inside the sandbox proves the bytes crossed to the host.
type echoServer struct {
	ln           net.Listener
	token, reply string

	reached, answered atomic.Int64
}

// listenEcho listens on dir's socket as the server does (listenUnix in
// package sandboxes): mode 0666 for the sandbox's uid, through a short
// path, since a socket's path holds at most 107 bytes and dir's may be
// longer.
func listenEcho(dir string) (*echoServer, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	name := filepath.Base(engine.EgressSocket)
	ln, err := net.Listen("unix", "/proc/self/fd/"+strconv.Itoa(int(d.Fd()))+"/"+name)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(filepath.Join(dir, name), 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	e := &echoServer{ln: ln, token: "vertal-doctor-" + randomHex(8), reply: "vertal-host-" + randomHex(8)}
	go e.serve()
	return e, nil
}

func (e *echoServer) serve() {
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.reached.Add(1)
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			buf := make([]byte, len(e.token))
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != e.token {
				return
			}
			e.answered.Add(1)
			io.WriteString(c, e.reply)
		}()
	}
}

func (e *echoServer) close() { e.ln.Close() }

// newSandboxID names the check's sandbox as the service names its own.
func newSandboxID() string { return "sbx_" + randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
