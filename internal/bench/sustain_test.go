package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

func TestWriteSustainVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    SustainResult
		want []string
	}{
		{"all met", SustainResult{Lang: "python", Duration: time.Minute, Clients: 2,
			Bare: Stats{PerSecond: 100}, API: Stats{PerSecond: 80, P50: 10 * time.Millisecond, P99: 25 * time.Millisecond},
			RSSBefore: 100 << 20, RSSAfter: 130 << 20, RSSSettled: 105 << 20},
			[]string{"| python | 2 × 1m0s | 100.0 | 80.0 | 0.80 met |", "2.50 met", "(1.05× met)"}},
		{"all missed", SustainResult{Lang: "bash", Duration: time.Minute, Clients: 2,
			Bare: Stats{PerSecond: 100}, API: Stats{PerSecond: 50, P50: 10 * time.Millisecond, P99: 40 * time.Millisecond},
			RSSBefore: 100 << 20, RSSAfter: 130 << 20, RSSSettled: 120 << 20},
			[]string{"0.50 missed", "4.00 missed", "(1.20× missed)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			WriteSustain(&b, []SustainResult{tc.r})
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("table lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestProcessRSS(t *testing.T) {
	rss, err := ProcessRSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("ProcessRSS(self) = %d, %v; want at least 1 MiB", rss, err)
	}
	if _, err := ProcessRSS(-1); err == nil {
		t.Fatal("ProcessRSS(-1) succeeded")
	}
}

func TestMeasureForStopsOnTime(t *testing.T) {
	s := MeasureFor(context.Background(), func(context.Context) error { time.Sleep(time.Millisecond); return nil }, 2, 1, 50*time.Millisecond)
	if len(s.Latencies) == 0 || s.Wall < 50*time.Millisecond {
		t.Fatalf("MeasureFor: %d samples in %v", len(s.Latencies), s.Wall)
	}
	if s.Wall > 5*time.Second {
		t.Fatalf("MeasureFor ran %v for a 50ms budget", s.Wall)
	}
}
