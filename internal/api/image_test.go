package api

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// withDatasci adds an image "datasci" built by vertal image build (its
// image.json says build version) next to the default one, which has none.
func withDatasci(t *testing.T, version string) envOption {
	dir := t.TempDir()
	m := `{"name":"datasci","version":"` + version + `","built_at":"2026-03-01T00:00:00Z","languages":{},"packages":{}}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	return withService(func(o *execution.Options) {
		o.Images = []config.Image{
			{Name: config.DefaultImage, Languages: testLanguages},
			{Name: "datasci", Dir: dir, Languages: testLanguages},
		}
	})
}

// imageOf is an execution object's image and image_version; a field that
// is missing reads as "missing", null as nil.
func imageOf(t *testing.T, body []byte) [2]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	out := [2]any{"missing", "missing"}
	for i, k := range []string{"image", "image_version"} {
		if v, ok := m[k]; ok {
			out[i] = v
		}
	}
	return out
}

// TestExecutionImage: every answer that carries an execution says which
// image ran it and which build of it: POST (sync, streamed, async, batch,
// replay), GET, the events stream's result and the webhook body.
func TestExecutionImage(t *testing.T) {
	const build = "20260301T000000Z-7"
	env := newEnv(t, withDatasci(t, build))
	def, ds := [2]any{"default", nil}, [2]any{"datasci", build}
	run := func(body map[string]any, header map[string]string) response {
		return env.do(request{method: http.MethodPost, path: "/v1/executions", body: jsonBody(body), header: header})
	}
	for _, tc := range []struct {
		name string
		body map[string]any
		want [2]any
	}{
		{"no image named", map[string]any{"language": "python", "code": "print(6 * 7)"}, def},
		{"default named", map[string]any{"language": "python", "code": "print(6 * 7)", "image": "default"}, def},
		{"built image", map[string]any{"language": "python", "code": "print(6 * 7)", "image": "datasci"}, ds},
		{"async", map[string]any{"language": "python", "code": "print(6 * 7)", "image": "datasci", "async": true}, ds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := map[string]string{"Idempotency-Key": "image-" + strings.ReplaceAll(tc.name, " ", "-")}
			res := run(tc.body, key)
			if res.status != http.StatusOK && res.status != http.StatusAccepted {
				t.Fatalf("POST: %d %s", res.status, res.body)
			}
			id := decode(t, res)["id"].(string)
			answers := map[string][]byte{"POST": res.body}
			env.work()
			answers["GET"] = env.do(request{path: "/v1/executions/" + id}).body
			answers["replay"] = run(tc.body, key).body
			evs, _ := parseSSE(t, string(env.do(request{path: "/v1/executions/" + id + "/events"}).body))
			if len(evs) == 0 || evs[len(evs)-1].Event != "result" {
				t.Fatalf("events: %+v", evs)
			}
			answers["events result"] = []byte(evs[len(evs)-1].Data)
			for what, body := range answers {
				if diff := cmp.Diff(tc.want, imageOf(t, body)); diff != "" {
					t.Errorf("%s: image, image_version (-want +got):\n%s", what, diff)
				}
			}
		})
	}

	golden(t, "run_image", run(map[string]any{"language": "python", "code": "print(6 * 7)", "image": "datasci"}, nil))

	t.Run("streamed", func(t *testing.T) {
		res := run(map[string]any{"language": "python", "code": "stream", "image": "datasci"}, streamHeader)
		evs, _ := parseSSE(t, string(res.body))
		if len(evs) == 0 || evs[len(evs)-1].Event != "result" {
			t.Fatalf("events: %+v", evs)
		}
		if diff := cmp.Diff(ds, imageOf(t, []byte(evs[len(evs)-1].Data))); diff != "" {
			t.Errorf("result event (-want +got):\n%s", diff)
		}
	})

	t.Run("batch", func(t *testing.T) {
		res := env.do(request{method: http.MethodPost, path: "/v1/executions/batch", body: jsonBody(map[string]any{
			"executions": []map[string]any{
				{"language": "python", "code": "print(1)"},
				{"language": "python", "code": "print(2)", "image": "datasci"},
			}})})
		var got struct{ Executions []json.RawMessage }
		if err := json.Unmarshal(res.body, &got); err != nil || len(got.Executions) != 2 {
			t.Fatalf("batch: %d %s", res.status, res.body)
		}
		for i, want := range [][2]any{def, ds} {
			if diff := cmp.Diff(want, imageOf(t, got.Executions[i])); diff != "" {
				t.Errorf("executions[%d] (-want +got):\n%s", i, diff)
			}
		}
	})

	// A row stored before images were recorded has neither: null, not "".
	t.Run("stored before images were recorded", func(t *testing.T) {
		old := store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Tenant: "acme", KeyID: env.keyID, RequestID: "req_1",
			Language: "python", Status: "succeeded", CreatedAt: testStart, StartedAt: testStart, FinishedAt: testStart}
		if err := env.store.SaveExecution(context.Background(), old); err != nil {
			t.Fatal(err)
		}
		res := env.do(request{path: "/v1/executions/" + old.ID})
		if diff := cmp.Diff([2]any{nil, nil}, imageOf(t, res.body)); diff != "" {
			t.Errorf("GET (-want +got):\n%s", diff)
		}
	})
}

// TestRenderExecutionImage: the webhook body carries the image and build.
func TestRenderExecutionImage(t *testing.T) {
	for _, tc := range []struct {
		image, version string
		want           [2]any
	}{
		{"datasci", "20260301T000000Z-7", [2]any{"datasci", "20260301T000000Z-7"}},
		{"default", "", [2]any{"default", nil}},
		{"", "", [2]any{nil, nil}},
	} {
		body, err := RenderExecution(store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Status: "succeeded",
			Image: tc.image, ImageVersion: tc.version, CreatedAt: testStart})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, imageOf(t, body)); diff != "" {
			t.Errorf("image %q version %q (-want +got):\n%s", tc.image, tc.version, diff)
		}
	}
}
