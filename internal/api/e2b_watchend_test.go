package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// e2bWatch opens filesystem.Filesystem/WatchDir on /home/user, closes
// opened once its start event came, and returns the rest of the stream
// once it ends (in 20 s at most).
func (e *testEnv) e2bWatch(id, token string, opened chan<- struct{}) ([]e2bFrame, error) {
	var once sync.Once
	open := func() { once.Do(func() { close(opened) }) }
	defer open()
	msg := []byte(`{"path":"/home/user"}`)
	var body bytes.Buffer
	body.WriteByte(0)
	_ = binary.Write(&body, binary.BigEndian, uint32(len(msg)))
	body.Write(msg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.http.URL+"/e2b/filesystem.Filesystem/WatchDir", &body)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("X-Access-Token", token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	head := make([]byte, 5) // the start event's envelope
	if _, err := io.ReadFull(res.Body, head); err != nil {
		return nil, fmt.Errorf("no start event: %w", err)
	}
	if _, err := io.ReadFull(res.Body, make([]byte, binary.BigEndian.Uint32(head[1:5]))); err != nil {
		return nil, err
	}
	open()
	tail, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the watch: %w", err)
	}
	return e2bFrames(tail)
}

// TestE2BWatchEnds: a watch never resumes a paused sandbox (it ends,
// unavailable), and the rotation of the key behind its token ends it too
// (a review found a watch held a free sandbox alive past its lifetime by
// resuming it, and outlived a rotation).
func TestE2BWatchEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(env *testEnv, id, keyID string)
		code string
	}{
		{"pause", func(env *testEnv, id, _ string) {
			r := env.do(request{method: "POST", path: "/e2b/sandboxes/" + id + "/pause", key: "-", header: map[string]string{"X-API-KEY": env.key}})
			if r.status != http.StatusNoContent {
				t.Errorf("pause: %d %s", r.status, r.body)
			}
		}, "unavailable"},
		{"rotation", func(env *testEnv, _ string, keyID string) {
			if err := env.store.RevokeKey(context.Background(), keyID, env.clock.Now()); err != nil {
				t.Error(err)
			}
		}, "unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, fake := newSandboxEnv(t)
			key, keyID := env.newKey("acme", "pro")
			id, token := env.e2bCreate(t, key)
			opened := make(chan struct{})
			done := make(chan []e2bFrame, 1)
			var werr error
			go func() {
				frames, err := env.e2bWatch(id, token, opened)
				werr = err
				done <- frames
			}()
			<-opened
			tc.end(env, id, keyID)
			frames := <-done
			if werr != nil {
				t.Fatal(werr)
			}
			if len(frames) == 0 || frames[len(frames)-1].flags != 2 || !strings.Contains(string(frames[len(frames)-1].msg), `"`+tc.code+`"`) {
				t.Errorf("the watch ended with %q, want an end-stream error %s", frames, tc.code)
			}
			if sb, err := fake.Get(context.Background(), execution.Caller{Key: store.Key{Tenant: "acme"}}, id); err == nil && tc.name == "pause" && sb.Status != "paused" {
				t.Errorf("after the watch: sandbox %s, want it still paused", sb.Status)
			}
		})
	}
}
