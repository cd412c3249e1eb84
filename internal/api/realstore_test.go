package api

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres/pgtest"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
)

// realStores opens each real store for one test: SQLite always, and
// PostgreSQL when VERTAL_TEST_DATABASE_URL is set (CI sets it).
func realStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	out := map[string]func(t *testing.T) store.Store{
		"sqlite": func(t *testing.T) store.Store {
			st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "vertal.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
	if os.Getenv("VERTAL_TEST_DATABASE_URL") != "" {
		out["postgres"] = func(t *testing.T) store.Store {
			st, err := postgres.Open(context.Background(), NewTestDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}
	}
	return out
}

// NewTestDatabase is an empty PostgreSQL database for one test.
func NewTestDatabase(t *testing.T) string {
	t.Helper()
	return pgtest.NewDatabase(t)
}

// TestOnRealStores repeats the races and the key life cycle on the real
// stores: the fake's one mutex proves nothing about database atomicity.
func TestOnRealStores(t *testing.T) {
	for name, open := range realStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Run("QuotaBurst", func(t *testing.T) {
				plans := config.DefaultPlans()
				plans["burst"] = config.Plan{ExecutionsPerDay: 100, RequestsPerMinute: 10000, MaxTimeoutS: 10, MemoryMB: 64}
				env := newEnv(t, withStore(open(t)), withPlans(plans))
				key, _ := env.newKey("burst", "burst")
				res := parallelRuns(env, 150, key, nil)
				if diff := cmp.Diff(map[int]int{200: 100, 429: 50}, countStatuses(res)); diff != "" {
					t.Errorf("statuses (-want +got):\n%s", diff)
				}
				if n := env.driver.runs.Load(); n != 100 {
					t.Errorf("ran %d, want 100", n)
				}
			})
			t.Run("IdempotentParallel", func(t *testing.T) {
				env := newEnv(t, withStore(open(t)))
				env.driver.started = make(chan string, 100)
				const n = 20
				var res []response
				done := make(chan struct{})
				go func() {
					res = parallelRuns(env, n, env.key, map[string]string{"Idempotency-Key": "same"}, "block")
					close(done)
				}()
				<-env.driver.started
				waitFor(t, func() bool { return env.store.claims.Load() >= n })
				env.driver.release()
				<-done
				if diff := cmp.Diff(map[int]int{200: n}, countStatuses(res)); diff != "" {
					t.Errorf("statuses (-want +got):\n%s", diff)
				}
				if r := env.driver.runs.Load(); r != 1 {
					t.Errorf("ran %d times", r)
				}
			})
			t.Run("RotateRevokeAndTenants", func(t *testing.T) {
				env := newEnv(t, withStore(open(t)))
				other, otherID := env.newKey("globex", "free")
				id := decode(t, env.run("python", "print(6 * 7)", nil))["id"].(string)
				if r := env.do(request{path: "/v1/executions/" + id, key: other}); r.status != 404 {
					t.Errorf("other tenant read it: %d", r.status)
				}
				if r := env.do(request{path: "/v1/executions/" + id}); r.status != 200 || decode(t, r)["stdout"] != "42\n" {
					t.Errorf("owner: %d %s", r.status, r.body)
				}
				rot := decode(t, env.do(request{method: "POST", path: "/v1/keys/rotate"}))
				if r := env.do(request{path: "/v1/usage"}); r.status != 401 {
					t.Errorf("old key: %d", r.status)
				}
				newKey := rot["api_key"].(string)
				if r := env.do(request{path: "/v1/usage", key: newKey}); r.status != 200 || decode(t, r)["today"].(map[string]any)["executions"] != 1.0 {
					t.Errorf("new key: %d %s", r.status, r.body)
				}
				if err := env.store.RevokeKey(context.Background(), otherID, time.Now()); err != nil {
					t.Fatal(err)
				}
				if r := env.do(request{path: "/v1/usage", key: other}); r.status != 401 {
					t.Errorf("revoked: %d", r.status)
				}
			})
		})
	}
}

func parallelRuns(env *testEnv, n int, key string, header map[string]string, code ...string) []response {
	c := "print(6 * 7)"
	if len(code) > 0 {
		c = code[0]
	}
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = env.do(request{method: "POST", path: "/v1/executions", key: key, header: header, body: jsonBody(map[string]any{"language": "python", "code": c})})
		}()
	}
	wg.Wait()
	return out
}

func countStatuses(rs []response) map[int]int {
	m := map[int]int{}
	for _, r := range rs {
		m[r.status]++
	}
	return m
}
