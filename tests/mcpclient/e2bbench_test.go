package mcpclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/bench"
)

// e2bBenchResult is what e2bbench.mjs prints.
type e2bBenchResult struct {
	Rounds   int                     `json:"rounds"`
	Warmup   int                     `json:"warmup"`
	Node     string                  `json:"node"`
	E2BSDK   string                  `json:"e2b_sdk"`
	Seconds  float64                 `json:"seconds"`
	Loops    map[string]e2bBenchLoop `json:"loops"`
	RatioP50 map[string]*float64     `json:"ratio_p50"`
}

type e2bBenchLoop struct {
	N          int          `json:"n"`
	Errors     int          `json:"errors"`
	FirstError string       `json:"first_error"`
	Total      e2bBenchPart `json:"total"`
	Create     e2bBenchPart `json:"create"`
	Run        e2bBenchPart `json:"run"`
	Kill       e2bBenchPart `json:"kill"`
}

type e2bBenchPart struct {
	P50 *float64 `json:"p50_ms"`
	P95 *float64 `json:"p95_ms"`
}

// The loops and parts e2bbench.mjs reports, in table order.
var (
	e2bBenchLoops = []string{"e2b", "own"}
	e2bBenchParts = []string{"total", "create", "run", "kill"}
)

// part is the figures of one of e2bBenchParts.
func (l e2bBenchLoop) part(name string) e2bBenchPart {
	return map[string]e2bBenchPart{"total": l.Total, "create": l.Create, "run": l.Run, "kill": l.Kill}[name]
}

// e2bBenchRun runs e2bbench.mjs against the shared server: rounds measured
// rounds after warmup ones, each loop on pro keys of its own tenants, one
// key per 30 rounds (3 requests a round), so that no tenant passes the
// plan's 120 requests a minute.
func e2bBenchRun(tb testing.TB, rounds, warmup int) (e2bBenchResult, cmdResult) {
	tb.Helper()
	dir := filepath.Join(e2e.repo, "tests", "mcpclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		tb.Fatalf("E2B's SDK is not installed: run npm ci in %s", dir)
	}
	keys := func() string {
		var ks []string
		for range (rounds + warmup + 29) / 30 {
			ks = append(ks, newKey(tb, "pro"))
		}
		return strings.Join(ks, ",")
	}
	env := []string{
		"E2B_API_URL=" + e2e.url + "/e2b", "E2B_SANDBOX_URL=" + e2e.url + "/e2b", "E2B_API_KEY=" + keys(),
		"KUBO_API_URL=" + e2e.url, "KUBO_API_KEY=" + keys(),
		// Nothing may reach E2B's cloud: no telemetry, no other domain.
		"E2B_DOMAIN=invalid.localhost", "E2B_DEBUG=",
	}
	got := run(tb, env, "", "node", filepath.Join(dir, "e2bbench.mjs"), strconv.Itoa(rounds), strconv.Itoa(warmup))
	if got.exit != 0 {
		tb.Fatalf("node e2bbench.mjs %d %d: exit %d\nstdout:\n%s\nstderr:\n%s", rounds, warmup, got.exit, got.stdout, got.stderr)
	}
	var res e2bBenchResult
	if err := json.Unmarshal([]byte(got.stdout), &res); err != nil {
		tb.Fatalf("e2bbench.mjs printed no JSON object: %v\n%s", err, got.stdout)
	}
	return res, got
}

// e2bBenchTable is the result as the Markdown table of docs/BENCHMARKS.md,
// under a line that describes the run.
func e2bBenchTable(res e2bBenchResult) string {
	ms := func(v *float64) string {
		if v == nil {
			return "–"
		}
		return fmt.Sprintf("%.1f ms", *v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d rounds after %d warm-up in %.1f s, node %s, e2b %s; errors: E2B SDK %d, own API %d\n",
		res.Rounds, res.Warmup, res.Seconds, res.Node, res.E2BSDK, res.Loops["e2b"].Errors, res.Loops["own"].Errors)
	b.WriteString("| step | E2B SDK p50 | E2B SDK p95 | own API p50 | own API p95 | p50 E2B / own |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, part := range e2bBenchParts {
		a, o := res.Loops["e2b"].part(part), res.Loops["own"].part(part)
		ratio := "–"
		if r := res.RatioP50[part]; r != nil {
			ratio = fmt.Sprintf("%.2f", *r)
		}
		name := part
		if part == "total" {
			name = "create → run → kill"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", name, ms(a.P50), ms(a.P95), ms(o.P50), ms(o.P95), ratio)
	}
	return b.String()
}

// envInt is a whole number of at least 0 from the environment, or def.
func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a whole number, 0 or more", name, s)
	}
	return n
}

// BenchmarkE2BLoop times create → run `echo 1` → kill through E2B's SDK
// and through our own /v1 API, interleaved in one run of e2bbench.mjs
// (issue 24), against the shared `vertal serve`: VERTAL_E2B_BENCH_ROUNDS
// rounds (default 20, one loop of each) after VERTAL_E2B_BENCH_WARMUP
// (default 3). One op is one such run, so the default -benchtime runs it
// once. Reported: the p50 and p95 of each loop, the p50 of each step, and
// the SDK's p50 over ours (e2b/own-…); the log has the whole table and the
// machine's load. Nothing about the times is asserted.
//
//	. /tmp/e2eenv && go test -run '^$' -bench E2BLoop -benchtime 1x ./tests/mcpclient/
func BenchmarkE2BLoop(b *testing.B) {
	server(b)
	rounds := max(1, envInt(b, "VERTAL_E2B_BENCH_ROUNDS", 20))
	warmup := envInt(b, "VERTAL_E2B_BENCH_WARMUP", 3)
	busy, err := bench.Background(context.Background(), bench.NewHostCPU(), time.Second)
	if err != nil {
		b.Logf("CPU time before the run: %v", err)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	var res e2bBenchResult
	for b.Loop() {
		res, _ = e2bBenchRun(b, rounds, warmup)
	}
	for _, loop := range e2bBenchLoops {
		l := res.Loops[loop]
		reportIf(b, l.Total.P50, loop+"-p50-ms")
		reportIf(b, l.Total.P95, loop+"-p95-ms")
		for _, step := range e2bBenchParts[1:] {
			reportIf(b, l.part(step).P50, loop+"-"+step+"-p50-ms")
		}
	}
	for _, part := range e2bBenchParts {
		reportIf(b, res.RatioP50[part], "e2b/own-"+part)
	}
	b.Logf("before the run the machine kept %.2f CPUs busy on its own; load average %s\n%s",
		busy, strings.TrimSpace(string(load)), e2bBenchTable(res))
}

// reportIf reports v as unit when the script measured it.
func reportIf(b *testing.B, v *float64, unit string) {
	if v != nil {
		b.ReportMetric(*v, unit)
	}
}

// TestE2BBenchScript keeps e2bbench.mjs working: one round, no warm-up,
// and every figure of its JSON present. It times nothing.
func TestE2BBenchScript(t *testing.T) {
	server(t)
	res, got := e2bBenchRun(t, 1, 0)
	if res.Rounds != 1 || res.Warmup != 0 || res.Node == "" || res.E2BSDK == "" {
		t.Errorf("run description: %+v\n%s", res, got.stdout)
	}
	for _, loop := range e2bBenchLoops {
		l, ok := res.Loops[loop]
		if !ok || l.N != 1 || l.Errors != 0 {
			t.Errorf("loop %s: %+v\n%s", loop, l, got.stdout)
			continue
		}
		for _, part := range e2bBenchParts {
			if p := l.part(part); p.P50 == nil || p.P95 == nil || *p.P50 <= 0 || *p.P95 < *p.P50 {
				t.Errorf("loop %s has no p50 and p95 for %s: %s", loop, part, got.stdout)
			}
		}
	}
	for _, part := range e2bBenchParts {
		if r := res.RatioP50[part]; r == nil || *r <= 0 {
			t.Errorf("no ratio of the p50s for %s: %s", part, got.stdout)
		}
	}
	if table := e2bBenchTable(res); strings.Count(table, "\n| ") != len(e2bBenchParts)+1 {
		t.Errorf("table:\n%s", table)
	}
}
