package api

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
)

// BenchmarkAPIOverhead measures what the API adds to an execution: HTTP,
// auth, rate limit, validation, quota reservation and storing the result
// in SQLite, over a driver that answers at once. Compare with the engine's
// own p50 (vertal bench) to get the API's share of the latency.
func BenchmarkAPIOverhead(b *testing.B) {
	for _, tc := range []struct {
		name  string
		store string
	}{{"fake", "fake"}, {"sqlite", "sqlite"}} {
		b.Run(tc.name, func(b *testing.B) {
			plans := config.DefaultPlans()
			plans["bench"] = config.Plan{ExecutionsPerDay: 1 << 40, RequestsPerMinute: 1 << 40, MaxTimeoutS: 10, MemoryMB: 64}
			opts := []envOption{withPlans(plans), withEngine(enginetest.Options(64))}
			if tc.store == "sqlite" {
				st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "vertal.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				opts = append(opts, withStore(st))
			}
			env := newEnv(b, opts...)
			key, _ := env.newKey("bench", "bench")
			body := `{"language":"python","code":"print(6 * 7)"}`
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: body}); r.status != 200 {
					b.Fatalf("%d %s", r.status, r.body)
				}
			}
		})
	}
}
