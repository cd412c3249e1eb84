package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/api/apitest"
	"github.com/kuboprotocol/vertal2kubo/internal/api/sandboxfake"
)

// sandboxClient is a client of the real API handlers over a sandboxfake.
func sandboxClient(t *testing.T) (*client.Client, *sandboxfake.Fake, *apitest.Server) {
	t.Helper()
	fake := sandboxfake.New()
	srv := apitest.New(t, fake)
	c, err := client.New(srv.URL, srv.Key, client.WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	return c, fake, srv
}

// newSandbox is a sandbox created with no parameters on a fresh fake.
func newSandbox(t *testing.T) (*client.Sandbox, *sandboxfake.Fake) {
	t.Helper()
	c, fake, _ := sandboxClient(t)
	sb, err := c.CreateSandbox(context.Background(), client.SandboxParams{})
	if err != nil {
		t.Fatal(err)
	}
	return sb, fake
}

func TestSandboxSDKLifecycle(t *testing.T) {
	ctx := context.Background()
	c, fake, srv := sandboxClient(t)
	sb, err := c.CreateSandbox(ctx, client.SandboxParams{Timeout: 90*time.Second + time.Millisecond, Metadata: map[string]string{"team": "ml"},
		OnTimeout: "pause", Files: []client.File{{Path: "in/a.bin", Content: []byte{0, 1, 2}}}, IdempotencyKey: "create-1"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status != client.SandboxRunning || sb.OnTimeout != "pause" || !strings.HasPrefix(sb.ID, "sbx_") || sb.Limits.MaxFileMB != 1 {
		t.Errorf("created %+v", sb)
	}
	if fake.LastCreate.TimeoutS != 91 || fake.LastIdemKey != "create-1" || string(fake.LastCreate.Files[0].Content) != "\x00\x01\x02" {
		t.Errorf("service got %+v key %q", fake.LastCreate, fake.LastIdemKey)
	}
	// Without a key the client makes one, so its own retries are safe.
	other, err := c.CreateSandbox(ctx, client.SandboxParams{})
	if err != nil || !strings.HasPrefix(fake.LastIdemKey, "vertal-") {
		t.Fatalf("%v %q", err, fake.LastIdemKey)
	}
	page, err := c.ListSandboxes(ctx, client.ListParams{Status: client.SandboxRunning, Metadata: map[string]string{"team": "ml"}})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != sb.ID || page.NextCursor != "" {
		t.Fatalf("list %+v %v", page, err)
	}
	first, err := c.ListSandboxes(ctx, client.ListParams{Limit: 1})
	if err != nil || first.Sandboxes[0].ID != other.ID || first.NextCursor == "" {
		t.Fatalf("first page %+v %v", first, err)
	}
	second, err := c.ListSandboxes(ctx, client.ListParams{Limit: 1, Cursor: first.NextCursor})
	if err != nil || second.Sandboxes[0].ID != sb.ID {
		t.Fatalf("second page %+v %v", second, err)
	}
	if err := sb.SetTimeout(ctx, 20*time.Minute); err != nil || !sb.ExpiresAt.Equal(sb.CreatedAt.Add(20*time.Minute)) {
		t.Errorf("timeout: %v %v", err, sb.ExpiresAt)
	}
	if err := sb.Pause(ctx); err != nil || sb.Status != client.SandboxPaused {
		t.Errorf("pause: %v %s", err, sb.Status)
	}
	if err := sb.Resume(ctx); err != nil || sb.Status != client.SandboxRunning {
		t.Errorf("resume: %v %s", err, sb.Status)
	}
	again, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || again.ID != sb.ID || again.Metadata["team"] != "ml" {
		t.Errorf("get: %+v %v", again, err)
	}
	if err := sb.Kill(ctx); err != nil || sb.Status != client.SandboxEnded || sb.Reason != "killed" || sb.EndedAt.IsZero() {
		t.Errorf("kill: %v %+v", err, sb)
	}
	err = sb.Pause(ctx)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != client.CodeSandboxNotRunning || apiErr.StatusCode != 409 {
		t.Errorf("pause of an ended sandbox: %v", err)
	}
	// Another tenant's key sees nothing.
	intruder, _ := client.New(srv.URL, srv.NewKey("intruder", "pro"))
	if _, err := intruder.GetSandbox(ctx, sb.ID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("another tenant's get: %v", err)
	}
	u, err := c.Usage(ctx)
	if err != nil || u.Sandboxes == nil || u.Sandboxes.Running != 1 {
		t.Errorf("usage %+v %v", u, err)
	}
}

func TestSandboxSDKCommands(t *testing.T) {
	ctx := context.Background()
	sb, fake := newSandbox(t)
	res, err := sb.Commands.Run(ctx, "echo hi", client.WithCwd("/tmp"), client.WithCommandEnv(map[string]string{"A": "1"}), client.WithCommandTimeout(5*time.Second))
	if err != nil || res.Stdout != "hi\n" || res.Status != client.StatusSucceeded || res.PID == 0 {
		t.Fatalf("run %+v %v", res, err)
	}
	if fake.LastCommand.Cwd != "/tmp" || fake.LastCommand.Env["A"] != "1" || fake.LastCommand.TimeoutS != 5 {
		t.Errorf("command %+v", fake.LastCommand)
	}
	res, err = sb.Commands.Run(ctx, "", client.WithArgv("exit", "4"))
	if err != nil || res.Status != client.StatusFailed || res.ExitCode != 4 {
		t.Errorf("argv run %+v %v", res, err)
	}
	var got []string
	for ev, err := range sb.Commands.Stream(ctx, "echo streamed") {
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case client.EventStdout:
			got = append(got, ev.ID+":"+ev.Text)
		case client.EventResult:
			got = append(got, "result:"+ev.Result.Stdout)
		}
	}
	if diff := cmp.Diff([]string{"1:streamed", "2:\n", "result:streamed\n"}, got); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	n := 0
	for _, err := range sb.Commands.Stream(ctx, "crash") {
		var apiErr *client.Error
		if n++; !errors.As(err, &apiErr) || apiErr.Code != "internal_error" || apiErr.StatusCode != 500 {
			t.Errorf("stream of a crash: %v", err)
		}
	}
	if n != 1 {
		t.Errorf("stream of a crash yielded %d times", n)
	}

	p, err := sb.Commands.Start(ctx, "cat")
	if err != nil || !p.Running {
		t.Fatalf("start %+v %v", p, err)
	}
	if err := sb.Commands.SendStdin(ctx, p.PID, "one\n", false); err != nil {
		t.Fatal(err)
	}
	if err := sb.Commands.SendStdin(ctx, p.PID, "two\n", true); err != nil {
		t.Fatal(err)
	}
	var evs []string
	for ev, err := range sb.Commands.Attach(ctx, p.PID, "1") {
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, string(ev.Type)+":"+ev.Text)
	}
	if diff := cmp.Diff([]string{"stdout:two\n", "exit:"}, evs); diff != "" {
		t.Errorf("attach after 1 (-want +got):\n%s", diff)
	}
	var apiErr *client.Error
	if err := sb.Commands.SendStdin(ctx, p.PID, "late", false); !errors.As(err, &apiErr) || apiErr.Code != client.CodeProcessFinished {
		t.Errorf("stdin of a finished command: %v", err)
	}
	sleeper, err := sb.Commands.Start(ctx, "sleep 100")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Commands.Signal(ctx, sleeper.PID, "KILL"); err != nil {
		t.Fatal(err)
	}
	list, err := sb.Commands.List(ctx)
	if err != nil || len(list) != 2 || list[1].Running || *list[1].ExitCode != 137 || list[1].EndedAt.IsZero() {
		t.Errorf("list %+v %v", list, err)
	}
}

func TestSandboxSDKFiles(t *testing.T) {
	ctx := context.Background()
	sb, _ := newSandbox(t)
	fe, err := sb.Files.Write(ctx, "out/data.bin", []byte("\x00bin"))
	if err != nil || fe.Path != "/home/user/out/data.bin" || fe.Size != 4 {
		t.Fatalf("write %+v %v", fe, err)
	}
	b, err := sb.Files.Read(ctx, "/home/user/out/data.bin")
	if err != nil || string(b) != "\x00bin" {
		t.Errorf("read %q %v", b, err)
	}
	if _, err := sb.Files.Read(ctx, "out"); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("read of a directory: %v", err)
	}
	if _, err := sb.Files.List(ctx, "out/data.bin"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("list of a file: %v", err)
	}
	if _, err := sb.Files.Mkdir(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files.Move(ctx, "out/data.bin", "new/moved.bin"); err != nil {
		t.Fatal(err)
	}
	entries, err := sb.Files.List(ctx, "new")
	if err != nil || len(entries) != 1 || entries[0].Name != "moved.bin" || entries[0].Type != "file" {
		t.Errorf("list %+v %v", entries, err)
	}
	if err := sb.Files.Remove(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files.Read(ctx, "new/moved.bin"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("read after remove: %v", err)
	}
	var apiErr *client.Error
	if _, err := sb.Files.Write(ctx, "big", make([]byte, 1<<20+1)); !errors.As(err, &apiErr) || apiErr.Code != client.CodePayloadTooLarge {
		t.Errorf("oversize write: %v", err)
	}
}
