package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteMarkdown renders rows as a Markdown table: latency at parallel 1,
// throughput and CPU per execution at each parallel level, and the ratios
// to the bare interpreter of the same language (p50: lower is better,
// 1.0 = as fast as bare; throughput: higher is better, 1.0 = as many per
// second; CPU: lower is better). The CPU comparison with bare, and the
// bench process's own part of the CPU, are those of the last (highest)
// parallel level, the 2-client run.
func WriteMarkdown(w io.Writer, rows []Row, parallel []int) error {
	var b strings.Builder
	head := []string{"target", "language", "p50", "p95"}
	for _, p := range parallel {
		head = append(head, fmt.Sprintf("exec/s ×%d", p))
	}
	head = append(head, "p50 / bare")
	for _, p := range parallel {
		head = append(head, fmt.Sprintf("exec/s ×%d / bare", p))
	}
	for _, p := range parallel {
		head = append(head, fmt.Sprintf("CPU ms ×%d", p))
	}
	if len(parallel) > 0 {
		p := parallel[len(parallel)-1]
		head = append(head, fmt.Sprintf("CPU ×%d / bare", p), fmt.Sprintf("CPU ×%d − bare (ms)", p), fmt.Sprintf("bench's own ×%d", p))
	}
	head = append(head, "errors")
	cells := [][]string{head}

	bare := map[string]Row{}
	for _, r := range rows {
		if r.Bare && len(r.Stats) > 0 {
			bare[r.Lang] = r
		}
	}
	for _, r := range rows {
		line := []string{r.Target, r.Lang}
		if r.Skipped != "" {
			for len(line) < len(head)-1 {
				line = append(line, "–")
			}
			line = append(line, "skipped: "+oneLine(r.Skipped, 80))
			cells = append(cells, line)
			continue
		}
		first := Stats{}
		if len(r.Stats) > 0 {
			first = r.Stats[0]
		}
		line = append(line, latency(first.P50), latency(first.P95))
		errs := 0
		var firstErr string
		for _, s := range r.Stats {
			line = append(line, rate(s))
			errs += s.Errors
			if firstErr == "" {
				firstErr = s.FirstErr
			}
		}
		b0, ok := bare[r.Lang]
		switch {
		case r.Bare:
			line = append(line, "1.00")
		case ok && len(b0.Stats) > 0 && b0.Stats[0].P50 > 0 && first.P50 > 0:
			line = append(line, fmt.Sprintf("%.2f", float64(first.P50)/float64(b0.Stats[0].P50)))
		default:
			line = append(line, "–")
		}
		for i, s := range r.Stats {
			switch {
			case r.Bare:
				line = append(line, "1.00")
			case ok && i < len(b0.Stats) && b0.Stats[i].PerSecond > 0 && s.PerSecond > 0:
				line = append(line, fmt.Sprintf("%.2f", s.PerSecond/b0.Stats[i].PerSecond))
			default:
				line = append(line, "–")
			}
		}
		var cpuErr string
		for _, s := range r.Stats {
			line = append(line, cpuMs(s))
			if cpuErr == "" {
				cpuErr = s.CPUErr
			}
		}
		if len(parallel) > 0 {
			last := Stats{}
			if len(r.Stats) > 0 {
				last = r.Stats[len(r.Stats)-1]
			}
			bl := Stats{}
			if ok && len(b0.Stats) > 0 {
				bl = b0.Stats[len(b0.Stats)-1]
			}
			line = append(line, cpuVsBare(last, bl, r.Bare)...)
			line = append(line, ownShare(last))
		}
		e := fmt.Sprint(errs)
		if errs > 0 {
			e += " (" + oneLine(firstErr, 60) + ")"
		}
		if cpuErr != "" {
			e += " (CPU not read: " + oneLine(cpuErr, 60) + ")"
		}
		line = append(line, e)
		cells = append(cells, line)
	}
	writeCells(&b, cells)
	_, err := io.WriteString(w, b.String())
	return err
}

// Ratio is one derived comparison printed under the table.
type Ratio struct {
	What   string
	Value  float64
	Target string // e.g. "≤ 2.0"
	Met    bool
}

// Ratios computes the speed targets from rows, where the rows exist:
// oci/crun p50 ≤ 2× bare python and throughput ≥ 0.7× bare (issue 2); the
// API with a warm pool at most as slow as bare python and node, within
// 3 ms of bare bash, and ≥ 0.7× bare throughput (issue 6); the docker
// driver ≤ 1.1× a raw `docker run` with the same flags (issue 2).
func Ratios(rows []Row) []Ratio {
	find := func(target, lang string) (Row, bool) {
		for _, r := range rows {
			if r.Target == target && r.Lang == lang && r.Skipped == "" && len(r.Stats) > 0 && r.Stats[0].P50 > 0 {
				return r, true
			}
		}
		return Row{}, false
	}
	var out []Ratio
	bare, okBare := find("bare", "python")
	if crun, ok := find("oci/crun", "python"); ok && okBare {
		v := float64(crun.Stats[0].P50) / float64(bare.Stats[0].P50)
		out = append(out, Ratio{"oci/crun python p50 / bare python3 p50", v, "≤ 2.0", v <= 2.0})
		last := len(crun.Stats) - 1
		if last < len(bare.Stats) && bare.Stats[last].PerSecond > 0 {
			v := crun.Stats[last].PerSecond / bare.Stats[last].PerSecond
			out = append(out, Ratio{fmt.Sprintf("oci/crun python exec/s ×%d / bare", crun.Stats[last].Parallel), v, "≥ 0.7", v >= 0.7})
		}
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.Target, APIWarmPool+" (") || r.Skipped != "" || len(r.Stats) == 0 || r.Stats[0].P50 == 0 {
			continue
		}
		b, ok := find("bare", r.Lang)
		if !ok {
			continue
		}
		api := warmPoolLabel(r.Target)
		if r.Lang == "bash" {
			d := ms(r.Stats[0].P50 - b.Stats[0].P50)
			out = append(out, Ratio{api + " bash p50 − bare bash p50 (ms)", d, "≤ 3", d <= 3})
		} else {
			v := float64(r.Stats[0].P50) / float64(b.Stats[0].P50)
			out = append(out, Ratio{fmt.Sprintf("%s %s p50 / bare p50", api, r.Lang), v, "≤ 1.0", v <= 1.0})
		}
		last := len(r.Stats) - 1
		if last < len(b.Stats) && b.Stats[last].PerSecond > 0 {
			v := r.Stats[last].PerSecond / b.Stats[last].PerSecond
			out = append(out, Ratio{fmt.Sprintf("%s %s exec/s ×%d / bare", api, r.Lang, r.Stats[last].Parallel), v, "≥ 0.7", v >= 0.7})
		}
		out = append(out, costRatios(r, b)...)
	}
	for _, rt := range []string{"runc", "runsc"} {
		for _, lang := range []string{"python", "javascript", "bash"} {
			drv, ok1 := find("docker/"+rt, lang)
			raw, ok2 := find("docker run "+rt+" (CLI)", lang)
			if ok1 && ok2 {
				v := float64(drv.Stats[0].P50) / float64(raw.Stats[0].P50)
				out = append(out, Ratio{fmt.Sprintf("docker/%s driver p50 / raw docker run p50 (%s)", rt, lang), v, "≤ 1.1", v <= 1.1})
			}
		}
	}
	return out
}

// Goals of issue 15 for the API with the warm pool, at the last parallel
// level (2 clients): CPU per execution at most cpuMaxRatio × bare (Python,
// Node) or bare + CPUMaxExtraBash (Bash), and throughput at least
// throughputMinRatio × bare.
var (
	cpuMaxRatio        = map[string]float64{"python": 1.3, "javascript": 1.3}
	throughputMinRatio = map[string]float64{"python": 0.8, "javascript": 0.9}
)

// CPUMaxExtraBash is issue 15's bound on Bash's CPU above bare.
const CPUMaxExtraBash = 3 * time.Millisecond

// costRatios checks one warm-pool API row against issue 15's goals.
func costRatios(r, bare Row) []Ratio {
	last := len(r.Stats) - 1
	if last < 0 || last >= len(bare.Stats) {
		return nil
	}
	s, b := r.Stats[last], bare.Stats[last]
	api := warmPoolLabel(r.Target)
	var out []Ratio
	if s.HasCPU && b.HasCPU {
		if bound, ok := cpuMaxRatio[r.Lang]; ok && b.CPU > 0 {
			v := float64(s.CPU) / float64(b.CPU)
			out = append(out, Ratio{fmt.Sprintf("%s %s CPU/exec ×%d / bare (issue 15)", api, r.Lang, s.Parallel), v, fmt.Sprintf("≤ %.1f", bound), v <= bound})
		}
		if r.Lang == "bash" {
			d := ms(s.CPU - b.CPU)
			out = append(out, Ratio{fmt.Sprintf("%s bash CPU/exec ×%d − bare (ms, issue 15)", api, s.Parallel), d, fmt.Sprintf("≤ %.0f", ms(CPUMaxExtraBash)), d <= ms(CPUMaxExtraBash)})
		}
	}
	// Issue 6 bounds Bash's p50 by bare + 3 ms; issue 15 asks for bare.
	if r.Lang == "bash" && r.Stats[0].P50 > 0 && len(bare.Stats) > 0 && bare.Stats[0].P50 > 0 {
		v := float64(r.Stats[0].P50) / float64(bare.Stats[0].P50)
		out = append(out, Ratio{api + " bash p50 / bare p50 (issue 15)", v, "≤ 1.0", v <= 1.0})
	}
	if bound, ok := throughputMinRatio[r.Lang]; ok && b.PerSecond > 0 {
		v := s.PerSecond / b.PerSecond
		out = append(out, Ratio{fmt.Sprintf("%s %s exec/s ×%d / bare (issue 15)", api, r.Lang, s.Parallel), v, fmt.Sprintf("≥ %.1f", bound), v >= bound})
	}
	return out
}

// warmPoolLabel names a warm-pool API target in a ratio's line, with the
// driver its server uses: "warm pool API (oci/crun)".
func warmPoolLabel(target string) string {
	return "warm pool API" + strings.TrimPrefix(target, APIWarmPool)
}

// WriteRatios renders the targets under the table.
func WriteRatios(w io.Writer, ratios []Ratio) {
	for _, r := range ratios {
		state := "met"
		if !r.Met {
			state = "NOT met"
		}
		fmt.Fprintf(w, "- %s = %.2f (target %s: %s)\n", r.What, r.Value, r.Target, state)
	}
}

func latency(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmtMs(d)
}

// cpuMs is the CPU per execution in milliseconds.
func cpuMs(s Stats) string {
	if !s.HasCPU {
		return "–"
	}
	return fmt.Sprintf("%.1f", ms(s.CPU))
}

// cpuVsBare is the ratio of s's CPU per execution to bare's and their
// difference in milliseconds.
func cpuVsBare(s, bare Stats, isBare bool) []string {
	switch {
	case isBare && s.HasCPU:
		return []string{"1.00", "0.0"}
	case s.HasCPU && bare.HasCPU && bare.CPU > 0:
		return []string{fmt.Sprintf("%.2f", float64(s.CPU)/float64(bare.CPU)), fmt.Sprintf("%+.1f", ms(s.CPU-bare.CPU))}
	case s.HasCPU && bare.HasCPU:
		return []string{"–", fmt.Sprintf("%+.1f", ms(s.CPU-bare.CPU))}
	}
	return []string{"–", "–"}
}

// ownShare is the bench process's own CPU per execution and its part of
// the machine's.
func ownShare(s Stats) string {
	switch {
	case !s.HasCPU:
		return "–"
	case s.CPU <= 0:
		return fmt.Sprintf("%.1f ms", ms(s.SelfCPU))
	}
	return fmt.Sprintf("%.1f ms (%.0f%%)", ms(s.SelfCPU), 100*float64(s.SelfCPU)/float64(s.CPU))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func rate(s Stats) string {
	if s.PerSecond == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", s.PerSecond)
}

func writeCells(b *strings.Builder, cells [][]string) {
	widths := make([]int, len(cells[0]))
	for _, row := range cells {
		for i, c := range row {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for n, row := range cells {
		b.WriteString("|")
		for i, c := range row {
			fmt.Fprintf(b, " %s%s |", c, strings.Repeat(" ", widths[i]-len([]rune(c))))
		}
		b.WriteString("\n")
		if n == 0 {
			b.WriteString("|")
			for _, w := range widths {
				b.WriteString(strings.Repeat("-", w+2) + "|")
			}
			b.WriteString("\n")
		}
	}
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) > n {
		return string([]rune(s)[:n-1]) + "…"
	}
	return s
}

// Names of the HTTP API targets that `vertal bench --http` measures; the
// driver the server uses follows in parentheses, e.g. "api, pool off
// (oci/crun)".
const (
	APIPoolOff  = "api, pool off"
	APIWarmPool = "api, warm pool"
)

// APIOverhead says, per language, how much the HTTP API adds on top of the
// engine: the p50 of the API with the warm pool off minus the p50 of the
// driver the server uses.
func APIOverhead(rows []Row) []string {
	var out []string
	for _, api := range rows {
		if !strings.HasPrefix(api.Target, APIPoolOff+" (") || api.Skipped != "" || len(api.Stats) == 0 || api.Stats[0].P50 == 0 {
			continue
		}
		drv := strings.TrimSuffix(strings.TrimPrefix(api.Target, APIPoolOff+" ("), ")")
		for _, r := range rows {
			if r.Target == drv && r.Lang == api.Lang && len(r.Stats) > 0 && r.Stats[0].P50 > 0 {
				d := api.Stats[0].P50 - r.Stats[0].P50
				out = append(out, fmt.Sprintf("API overhead (%s): p50 through the API with the pool off − %s p50 = %s", api.Lang, drv, fmtMs(d)))
			}
		}
	}
	return out
}
