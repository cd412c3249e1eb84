package egress

import (
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// TestHostKeepsOthersOut: a box's socket answers root (the driver's bind
// mount stands for the sandbox), and no other user of the host can find
// or reach it, whatever the modes above the node's directory.
func TestHostKeepsOthersOut(t *testing.T) {
	e2etest.Require(t, "root, to try the socket as another uid")
	// A data directory any user may pass through (t.TempDir's are 0700).
	base, err := os.MkdirTemp("", "egress-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostOptions{Dir: filepath.Join(base, "egress", "node"), Guard: webhook.NewGuard([]netip.Prefix{}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Reap(); err != nil {
		t.Fatal(err)
	}
	pol, err := Parse([]string{"allowed.test"}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	box, err := h.Open("exe_1", pol, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer box.Close()
	sock := filepath.Join(h.Dir("exe_1"), SocketName)
	connect := func(uid uint32) (string, error) {
		cmd := exec.Command("/usr/bin/python3", "-c", `import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print("connected")`, sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := connect(0); out != "connected" {
		t.Fatalf("root: %q %v", out, err)
	}
	out, err := connect(65534)
	if err == nil || !strings.Contains(out, "PermissionError") {
		t.Errorf("another user reached the socket: %q %v", out, err)
	}
	if fi, err := os.Stat(h.opts.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the node's directory: %v %v, want 0700", fi.Mode(), err)
	}
}
