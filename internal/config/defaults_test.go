package config

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

// TestUsageShowsTheDefaults: what `vertal serve -h` says a default is
// comes from Default (or the rule of the method deriving it), so the text
// cannot drift from the values.
func TestUsageShowsTheDefaults(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	Bind(fs)
	d := Default()
	for flagName, want := range map[string]string{
		"host":               "(default " + d.Host + ")",
		"port":               "(default 8080)",
		"queue-timeout":      "(default 30s)",
		"max-conns":          "(default 1024)",
		"max-conns-per-ip":   "(default 64)",
		"idle-timeout":       "(default 15s)",
		"pool-min":           "(default 1)",
		"pool-max":           "(default 4)",
		"pool-memory-mb":     "(default 1024)",
		"pool-plan":          "(default pro)",
		"driver":             "(default oci)",
		"data-dir":           "(default " + DefaultDataDir + ")",
		"state-dir":          "(default " + DefaultStateDir + ")",
		"image-dir":          "(default " + DefaultImageDir + ")",
		"docker-image":       "(default " + DefaultDockerImage + ")",
		"signup":             "(default invite)",
		"node-timeout":       "(default 1m)",
		"webhook-retry-for":  "(default 24h)",
		"webhook-retry-base": "(default 10s)",
		"max-concurrent":     "(default: " + derivedMaxConcurrent + ")",
		"max-queue":          "(default: " + derivedMaxQueue + ")",
		"node-id":            "(default: " + derivedNodeID + ")",
		"async-workers":      "(default: " + derivedAsyncWorkers + ")",
		"queue-rescue-after": "(default: " + derivedRescueAfter + ")",
	} {
		f := fs.Lookup(flagName)
		if f == nil {
			t.Errorf("no flag --%s", flagName)
			continue
		}
		if !strings.Contains(f.Usage, want) {
			t.Errorf("--%s usage %q does not say %q", flagName, f.Usage, want)
		}
	}
	// No usage writes a default by hand: it would not follow Default.
	for _, s := range settings {
		if strings.Contains(s.usage, "(default") {
			t.Errorf("--%s writes its default in its usage text; give the setting a def or derived instead", s.name)
		}
	}
	// The values behind the text are the ones a server gets.
	if d.PoolMin != DefaultPoolMin || d.PoolMax != DefaultPoolMax || d.PoolMemoryMB != DefaultPoolMemoryMB ||
		d.NodeTimeout.D() != time.Minute || d.WebhookRetryFor.D() != 24*time.Hour || d.WebhookRetryBase.D() != 10*time.Second {
		t.Errorf("Default() = %+v", d)
	}
}

// TestDerivedDefaults: the serve-time values derived from other settings
// when left zero, and kept when set.
func TestDerivedDefaults(t *testing.T) {
	host, _ := os.Hostname()
	c := Default()
	c.MaxConcurrent, c.DataDir = 8, "/srv/vertal"
	if got := c.QueueSize(); got != 32 {
		t.Errorf("QueueSize() = %d; want 4 x 8", got)
	}
	if got := c.Workers(); got != 4 {
		t.Errorf("Workers() = %d; want half of 8", got)
	}
	// The longest plan timeout (enterprise, 300 s) + queue-timeout + 2m.
	if got, want := c.RescueAfter(), 300*time.Second+30*time.Second+2*time.Minute; got != want {
		t.Errorf("RescueAfter() = %v; want %v", got, want)
	}
	node := c.Node()
	if !strings.HasPrefix(node, host+"-") || len(node) != len(host)+9 {
		t.Errorf("Node() = %q; want %s-<8 hex>", node, host)
	}
	other := c
	other.DataDir = "/srv/other"
	if other.Node() == node || c.Node() != node {
		t.Errorf("Node() must be stable for one data dir and differ for another: %q, %q", node, other.Node())
	}
	c.MaxConcurrent = 1
	if got := c.Workers(); got != 1 {
		t.Errorf("Workers() with one slot = %d; want at least 1", got)
	}

	set := c
	set.MaxQueue, set.AsyncWorkers, set.QueueRescueAfter, set.NodeID = 5, 1, Duration(time.Hour), "n1"
	if set.QueueSize() != 5 || set.Workers() != 1 || set.RescueAfter() != time.Hour || set.Node() != "n1" {
		t.Errorf("set values not kept: %d %d %v %q", set.QueueSize(), set.Workers(), set.RescueAfter(), set.Node())
	}
}

// TestPlanLimits: a request's limits, decided in one place: the engine's
// defaults with the plan's memory and file caps.
func TestPlanLimits(t *testing.T) {
	got := DefaultPlans()["pro"].Limits(7 * time.Second)
	want := engine.DefaultLimits(7 * time.Second)
	want.MemoryBytes, want.WorkdirBytes, want.ReturnFiles, want.ReturnBytes = 512<<20, 10<<20+engine.DefaultTmpBytes, 50, 10<<20
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pro limits (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("pro limits do not validate: %v", err)
	}
	if got.Lifetime != 7*time.Second+engine.LifetimeGrace {
		t.Errorf("Lifetime = %v", got.Lifetime)
	}
}

// TestQueueDefaultsMatch: the engine's test helper writes config's queue
// defaults out (it may not import config); they agree.
func TestQueueDefaultsMatch(t *testing.T) {
	got := enginetest.Options(3)
	if got.MaxQueue != DefaultQueuePerSlot*3 || got.QueueTimeout != DefaultQueue {
		t.Errorf("enginetest.Options(3) = %+v; want a queue of %d and a %v timeout", got, DefaultQueuePerSlot*3, DefaultQueue)
	}
}
