package web_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPlaygroundWithRealServer runs the browser suite against the README's
// first command: `vertal serve --dev`, built from this tree, with the real
// oci driver and the sandbox image, on a fresh SQLite file. A second tenant
// on a one-execution plan proves the quota message with a real 429.
func TestPlaygroundWithRealServer(t *testing.T) {
	requireServerE2E(t)
	dir := t.TempDir()
	bin := buildVertal(t)
	config := filepath.Join(dir, "config.json")
	plan := `{"plans": {"one-a-day": {"executions_per_day": 1, "requests_per_minute": 60, "max_timeout_s": 10, "memory_mb": 256, "max_concurrent": 1}}}`
	if err := os.WriteFile(config, []byte(plan), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--config", config, "--data-dir", filepath.Join(dir, "data")}
	serveArgs := append([]string{"serve", "--dev", "--host", "127.0.0.1", "--port", "0"}, common...)
	if rootfs := os.Getenv("VERTAL_ROOTFS"); rootfs != "" {
		// Only serve runs sandboxes; the operator commands take store flags.
		serveArgs = append(serveArgs, "--image-dir", filepath.Dir(rootfs))
	}

	srv := startServer(t, bin, serveArgs)

	// A tenant whose one execution of the day is used up.
	out, err := exec.Command(bin, append([]string{"create-key", "quota-test", "--plan", "one-a-day"}, common...)...).Output()
	if err != nil {
		t.Fatalf("create-key: %v", err)
	}
	quotaKey := strings.TrimSpace(string(out))
	if !strings.HasPrefix(quotaKey, "kubo_sk_") {
		t.Fatalf("create-key printed %q, want a key", quotaKey)
	}
	req, _ := http.NewRequest("POST", srv.url+"/api/v1/executions", strings.NewReader(`{"language": "bash", "code": "true"}`))
	req.Header.Set("Authorization", "Bearer "+quotaKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("using up the quota: %d %s", resp.StatusCode, body)
	}

	runPlaygroundSuite(t, target{url: srv.url, key: srv.key, quotaKey: quotaKey, realEngine: true})
	if dir := os.Getenv("VERTAL_SCREENSHOTS"); dir != "" {
		takeScreenshots(t, filepath.Join(dir, "real"), srv.url, srv.key)
	}
	if t.Failed() {
		t.Logf("server log:\n%s", srv.log())
	}
}

type server struct {
	url, key string
	mu       sync.Mutex
	stderr   bytes.Buffer
}

func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

type lockedWriter struct{ s *server }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.stderr.Write(p)
}

var (
	reListening = regexp.MustCompile(`listening on (http://\S+)`)
	reKey       = regexp.MustCompile(`^\s*(kubo_sk_\S+)\s*$`)
)

// startServer starts `vertal serve --dev` and reads its address and the
// development key from what it prints, as a newcomer would.
func startServer(t *testing.T, bin string, args []string) *server {
	t.Helper()
	return launchServer(t, bin, args, true)
}

// launchServer starts `vertal serve` and waits for its address, and for
// the development key too if withKey.
func launchServer(t *testing.T, bin string, args []string, withKey bool) *server {
	t.Helper()
	s := &server{}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = lockedWriter{s}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting vertal serve: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if m := reListening.FindStringSubmatch(line); m != nil && s.url == "" {
				s.url = m[1]
				if !withKey {
					close(found)
				}
			}
			if m := reKey.FindStringSubmatch(line); m != nil && s.key == "" {
				s.key = m[1]
				close(found)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-found:
	case <-done:
		t.Fatalf("vertal serve exited early:\n%s", s.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("vertal serve printed no address and key in 60 s:\n%s", s.log())
	}
	return s
}
