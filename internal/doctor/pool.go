package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// WarmPool is what the doctor needs of the warm pool: it runs executions
// like any driver and reports its state.
type WarmPool interface {
	engine.Driver
	Stats() []pool.Stats
}

// poolCheckTimeout is the timeout of the warm pool check's executions.
const poolCheckTimeout = 10 * time.Second

// PoolLimits are the limits of the warm pool check's executions: a pool
// built for the doctor keeps its sandboxes for them.
func PoolLimits() engine.Limits { return engine.DefaultLimits(poolCheckTimeout) }

// warmPrograms print "42" in each language.
var warmPrograms = func() map[string]string {
	out := map[string]string{}
	for _, d := range lang.All {
		out[d.Name] = d.Hello
	}
	return out
}()

// poolChecks waits for the pool to pre-start a sandbox per language, runs
// one execution through it and reports whether it ran warm, with the
// pool's state. The pool is a convenience, not a protection: its checks
// are never essential (a dry pool falls back to the cold path).
func poolChecks(ctx context.Context, p WarmPool, langs []engine.Language, wait time.Duration) []Check {
	var out []Check
	for _, lang := range langs {
		code, ok := warmPrograms[lang.Name]
		if !ok {
			continue
		}
		c := Check{Group: "warm pool", Name: "warm " + lang.Name}
		ready := waitReady(ctx, p, lang.Name, wait)
		before := statsOf(p, lang.Name)
		start := time.Now()
		res, err := p.Run(ctx, engine.Spec{ID: probes.NewExecutionID(), Language: lang, Code: code, Timeout: poolCheckTimeout,
			Limits: PoolLimits()})
		elapsed := time.Since(start)
		after := statsOf(p, lang.Name)
		switch {
		case err != nil:
			c.Status, c.Detail = StatusFail, "the execution failed: "+err.Error()
			c.Fix = "run with --verbose; --pool-max 0 turns the pool off (executions then take the cold path)"
		case strings.TrimSpace(res.Stdout) != "42":
			c.Status, c.Detail = StatusFail, fmt.Sprintf("printed %q (status %s)", oneLine(res.Stdout, 60), res.Status)
			c.Fix = "run with --verbose to see the program's output"
		case after.Hits > before.Hits:
			c.Status = StatusOK
			c.Detail = fmt.Sprintf("ran warm: %v end to end, code %v", elapsed.Round(100*time.Microsecond), res.Duration.Round(100*time.Microsecond))
		default:
			c.Status = StatusWarn
			c.Detail = fmt.Sprintf("ran cold in %v: no sandbox was ready (ready within %v: %v)", elapsed.Round(time.Millisecond), wait, ready)
			c.Fix = "the language could not be pre-started; run with --verbose for the pool's log"
		}
		out = append(out, c)
	}
	var parts []string
	for _, s := range p.Stats() {
		parts = append(parts, fmt.Sprintf("%s: %d ready, %d in use, %d hits, %d misses, %d crashed",
			s.Language, s.Ready, s.InUse, s.Hits, s.Misses, s.Crashed))
	}
	out = append(out, Check{Group: "warm pool", Name: "pool state", Status: StatusOK, Detail: strings.Join(parts, "; ")})
	return out
}

func waitReady(ctx context.Context, p WarmPool, lang string, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		if statsOf(p, lang).Ready > 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func statsOf(p WarmPool, lang string) pool.Stats {
	for _, s := range p.Stats() {
		if s.Language == lang {
			return s
		}
	}
	return pool.Stats{Language: lang}
}
