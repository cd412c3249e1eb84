package securitytest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// perUserAttack exhausts a per-user kernel limit in one sandbox while a
// second sandbox asks for one of the same resource. The kernel counts
// these per host uid: sandboxes sharing a uid share the limit, so the
// holder denies every other tenant the resource.
type perUserAttack struct {
	name string
	// take is a Python expression that returns a new resource's fd, or
	// -1 with errno set; i numbers the attempt.
	take string
}

func perUserAttacks() []perUserAttack {
	return []perUserAttack{
		// fs.inotify.max_user_instances (128 by default).
		{name: "inotify_instances_not_shared", take: "libc.inotify_init1(0)"},
		// RLIMIT_MSGQUEUE: 800 KiB of queues, 9 with the default sizes.
		{name: "mqueues_not_shared", take: `libc.mq_open(b"/vertal%d" % i, os.O_CREAT | os.O_RDWR, 0o600, None)`},
	}
}

// Timing of the attacks: the holder keeps what it took for holdFor; the
// other sandbox starts otherStart after it and asks after otherWait, so
// the ask falls inside the hold even when starting a sandbox is slow. The
// case checks that it did, from timestamps both programs print.
const (
	holdFor    = 8 * time.Second
	otherStart = 500 * time.Millisecond
	otherWait  = 2500 * time.Millisecond
)

// perUserLimits runs one attack: two sandboxes at once.
func perUserLimits(t *testing.T, e *env, a perUserAttack) {
	prelude := "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
	holder := prelude + fmt.Sprintf(`
held, err = 0, 0
for i in range(200):
    if %s < 0:
        err = ctypes.get_errno()
        break
    held += 1
print("held", held, "errno", err)
print("hold_start %%.3f" %% time.time(), flush=True)
time.sleep(%g)
print("hold_end %%.3f" %% time.time())
`, a.take, holdFor.Seconds())
	other := prelude + fmt.Sprintf(`
time.sleep(%g)
i = 999
t = time.time()
fd = %s
print("attempt %%.3f" %% t)
print("got fd" if fd >= 0 else "REFUSED errno %%d" %% ctypes.get_errno())
`, otherWait.Seconds(), a.take)

	type outcome struct {
		res engine.Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := e.run(t, Case{Lang: "python", Code: holder, Timeout: holdFor + 20*time.Second})
		first <- outcome{res, err}
	}()
	time.Sleep(otherStart)
	res, err := e.run(t, Case{Lang: "python", Code: other})
	h := <-first

	wantStatus(t, h.res, h.err, engine.StatusSucceeded, 0)
	wantStatus(t, res, err, engine.StatusSucceeded, 0)
	if t.Failed() {
		t.Logf("holder: %q %q; other: %q %q", h.res.Stdout, clip(h.res.Stderr), res.Stdout, clip(res.Stderr))
		return
	}
	var held, heldErr int
	var start, end, attempt float64
	for _, line := range strings.Split(h.res.Stdout+res.Stdout, "\n") {
		fmt.Sscanf(line, "held %d errno %d", &held, &heldErr)
		fmt.Sscanf(line, "hold_start %f", &start)
		fmt.Sscanf(line, "hold_end %f", &end)
		fmt.Sscanf(line, "attempt %f", &attempt)
	}
	if held == 0 || start == 0 || end == 0 || attempt == 0 {
		t.Fatalf("incomplete output: holder %q, other %q", h.res.Stdout, res.Stdout)
	}
	if attempt < start || attempt > end {
		t.Fatalf("inconclusive: the second sandbox asked at %.3f, outside the hold %.3f..%.3f (a slow start?)", attempt, start, end)
	}
	if !strings.Contains(res.Stdout, "got fd\n") {
		t.Errorf("while another sandbox held %d (then errno %d), this one was refused: %s", held, heldErr, res.Stdout)
	}
}
