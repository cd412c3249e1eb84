package bench

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// SustainResult is one language's sustained-load comparison: the bare
// interpreter's spawn rate and the API's rate with the same number of
// clients for the same time, and the server's memory around the load.
type SustainResult struct {
	Lang     string
	Duration time.Duration
	Clients  int
	Bare     Stats
	API      Stats
	// RSS of the API server process (and the sandboxes' cgroup memory is
	// not included): before the load, right after it, and after Settle.
	RSSBefore, RSSAfter, RSSSettled int64
	Settle                          time.Duration
}

// Targets of issue 6, checked in the report.
const (
	SustainMinRatio  = 0.7 // API exec/s over bare exec/s
	SustainMaxP99P50 = 3.0 // p99 over p50 of the API
	SustainMaxRSS    = 1.1 // settled RSS over RSS before the load
)

// WriteSustain renders the results as a Markdown table with the ratios.
func WriteSustain(w io.Writer, rs []SustainResult) {
	fmt.Fprintln(w, "| language | clients × time | bare exec/s | API exec/s | ratio (≥ 0.7) | API p50 | API p99 | p99/p50 (≤ 3) | server RSS before → after → settled (≤ 1.1×) | errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		ratio := 0.0
		if r.Bare.PerSecond > 0 {
			ratio = r.API.PerSecond / r.Bare.PerSecond
		}
		tail := 0.0
		if r.API.P50 > 0 {
			tail = float64(r.API.P99) / float64(r.API.P50)
		}
		mem := 0.0
		if r.RSSBefore > 0 {
			mem = float64(r.RSSSettled) / float64(r.RSSBefore)
		}
		fmt.Fprintf(w, "| %s | %d × %s | %.1f | %.1f | %.2f %s | %s | %s | %.2f %s | %s → %s → %s (%.2f× %s) | %d |\n",
			r.Lang, r.Clients, r.Duration, r.Bare.PerSecond, r.API.PerSecond, ratio, verdict(ratio >= SustainMinRatio),
			fmtMs(r.API.P50), fmtMs(r.API.P99), tail, verdict(tail <= SustainMaxP99P50),
			mib(r.RSSBefore), mib(r.RSSAfter), mib(r.RSSSettled), mem, verdict(mem <= SustainMaxRSS), r.API.Errors+r.Bare.Errors)
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// ProcessRSS reads a process's resident set size from /proc.
func ProcessRSS(pid int) (int64, error) {
	kb, err := sandbox.ProcKB("/proc/"+strconv.Itoa(pid)+"/status", "VmRSS:")
	return kb << 10, err
}
