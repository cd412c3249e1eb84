package api

import (
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

// escapedFileBody is the attack: one file whose content is n \u0001
// escapes, six body bytes for each decoded one.
func escapedFileBody(n int) string {
	return `{"language":"python","code":"x","files":[{"path":"a.bin","content":"` + strings.Repeat(`\u0001`, n) + `"}]}`
}

// TestDecodedSize: the decoded size is exact for every escape width.
func TestDecodedSize(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int64
	}{
		{`"abc"`, 5},
		{`"\u0001"`, 3},
		{`"\u00e9"`, 4},
		{`"\u20ac"`, 5},
		{`"\ud83d\ude00"`, 6},
		{`"\n\"\\"`, 5},
		{`"é"`, 4},
		{`"\u12"`, 6}, // not an escape: decoding refuses it
	} {
		if got := decodedSize([]byte(tc.body)); got != tc.want {
			t.Errorf("decodedSize(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}

// TestLargeEscapedBodiesBoundedMemory: bodies of escapes whose decoded
// file is over the plan's cap, sent eight at once. Each is refused (413
// before anything is expanded, or 503 at once when the server-wide body
// budget is taken), and what the server allocates for all of them stays
// under twice their total size. Before the bound, each was read with a
// growing buffer and decoded into several copies: about seven times its
// size.
func TestLargeEscapedBodiesBoundedMemory(t *testing.T) {
	plans := config.DefaultPlans()
	pro := plans["pro"]
	pro.MaxFilesMB = 1
	plans["pro"] = pro
	const n = 8
	body := escapedFileBody(2 << 20) // 12 MiB of body, 2 MiB decoded
	env := newEnv(t, withPlans(plans), withOptions(func(o *Options) { o.BodyBudget = 3 * decodeCost * int64(len(body)) }))
	if limit := env.srv.maxBodyBytes(pro); int64(len(body)) > limit {
		t.Fatalf("the body (%d bytes) is over the plan's body cap %d: the test would not reach decoding", len(body), limit)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", env.http.URL+"/v1/executions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+env.key)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses[i] = -1 // refused before the client finished writing
				return
			}
			res.Body.Close()
			statuses[i] = res.StatusCode
		}()
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("statuses %v; allocated %d MiB for %d bodies of %d MiB", statuses, allocated>>20, n, len(body)>>20)
	large := 0
	for _, st := range statuses {
		switch st {
		case http.StatusRequestEntityTooLarge:
			large++
		case http.StatusServiceUnavailable, -1:
		default:
			t.Errorf("a body over the files cap got %d", st)
		}
	}
	if large == 0 {
		t.Errorf("no body was refused as too large: %v", statuses)
	}
	if bound := uint64(2 * n * len(body)); allocated > bound {
		t.Errorf("the server allocated %d MiB for %d bodies of %d MiB; want under %d MiB", allocated>>20, n, len(body)>>20, bound>>20)
	}
	if env.driver.runs.Load() != 0 {
		t.Errorf("the driver ran")
	}
}

// FuzzFilesDecodedSize: the scan that runs before decoding never panics,
// and on a body the API decodes it gives the decoded size of the
// files exactly (base64 ones rounded down to whole groups).
func FuzzFilesDecodedSize(f *testing.F) {
	for _, seed := range []string{
		escapedFileBody(3),
		`{"files":[{"path":"a","content":"h\u00e9\n"},{"content":"QUJD","encoding":"base64","path":"b"}],"code":"x"}`,
		`{"code":"{[\"","files":[],"env":{"files":"x"}}`,
		`{"files":null}`,
		`{"files":[{"path":"a","content":"\ud83d\ude00","x":[1,{"y":"]"}]}]}`,
		`[`, `{"files":[{`, `{"files":[{"content":"\`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := filesDecodedSize(body, 1<<30)
		in, err := DecodeExecutionRequest(body)
		if err != nil || !ok {
			return
		}
		var want int64
		for _, file := range in.Files {
			if file.Encoding == "base64" {
				want += int64(len(file.Content)) / 4 * 3
			} else {
				want += int64(len(file.Content))
			}
		}
		if got != want {
			t.Errorf("filesDecodedSize(%q) = %d, want %d", body, got, want)
		}
	})
}
