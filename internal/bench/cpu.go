package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CPUCounters read cumulative CPU time. Run takes their difference around
// each block of executions, so only the deltas matter; the seam lets unit
// tests drive the accounting with fake counters.
type CPUCounters interface {
	// Machine is the busy CPU time of the whole machine, all CPUs summed.
	Machine() (time.Duration, error)
	// Self is the CPU time of the bench's own process (user + system,
	// every thread; not its children).
	Self() (time.Duration, error)
}

// CPUUse is the CPU spent during one measured window.
type CPUUse struct {
	Machine time.Duration // whole machine, busy time
	Self    time.Duration // the bench process itself
}

// Add sums two windows.
func (u CPUUse) Add(v CPUUse) CPUUse {
	return CPUUse{Machine: u.Machine + v.Machine, Self: u.Self + v.Self}
}

// readCPU reads both counters at once.
func readCPU(c CPUCounters) (CPUUse, error) {
	m, err := c.Machine()
	if err != nil {
		return CPUUse{}, err
	}
	s, err := c.Self()
	if err != nil {
		return CPUUse{}, err
	}
	return CPUUse{Machine: m, Self: s}, nil
}

// HostCPU reads the machine's busy time from /proc/stat and the process's
// own from getrusage(RUSAGE_SELF).
type HostCPU struct {
	// Stat is the path of /proc/stat (a test may point it elsewhere).
	Stat string
	// Hz is the kernel's clock ticks per second (USER_HZ), the unit of
	// /proc/stat; NewHostCPU reads it from the auxiliary vector.
	Hz int64
}

// NewHostCPU reads the host's counters. USER_HZ is what the kernel hands
// every process as AT_CLKTCK in its auxiliary vector, the value glibc's
// sysconf(_SC_CLK_TCK) returns; Go has no sysconf without cgo, so it is
// read from /proc/self/auxv. Where that fails, 100: the Linux ABI value on
// every mainstream architecture.
func NewHostCPU() HostCPU {
	hz := int64(100)
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if v, ok := AuxvValue(b, atClkTck); ok && v > 0 {
			hz = int64(v)
		}
	}
	return HostCPU{Stat: "/proc/stat", Hz: hz}
}

// Machine implements CPUCounters.
func (h HostCPU) Machine() (time.Duration, error) {
	f, err := os.Open(h.Stat)
	if err != nil {
		return 0, fmt.Errorf("reading machine CPU time: %w", err)
	}
	defer f.Close()
	t, err := ParseProcStat(f)
	if err != nil {
		return 0, fmt.Errorf("reading machine CPU time from %s: %w", h.Stat, err)
	}
	return t.Busy(h.Hz), nil
}

// Self implements CPUCounters.
func (h HostCPU) Self() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// CPUTicks are the fields of /proc/stat's aggregate "cpu" line, in clock
// ticks (USER_HZ). Guest time is already counted in User and Nice, so it
// has no field here.
type CPUTicks struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// BusyTicks is the time the CPUs spent working: everything but idle and
// iowait (a CPU waiting for I/O runs nothing).
func (t CPUTicks) BusyTicks() uint64 {
	return t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal
}

// Busy converts BusyTicks to a duration at hz ticks per second.
func (t CPUTicks) Busy(hz int64) time.Duration {
	if hz <= 0 {
		hz = 100
	}
	return time.Duration(t.BusyTicks() * uint64(time.Second) / uint64(hz))
}

// ErrNoCPULine means a /proc/stat text had no usable aggregate "cpu" line.
var ErrNoCPULine = errors.New(`no aggregate "cpu" line`)

// ParseProcStat reads the aggregate "cpu" line of /proc/stat (proc(5)).
// Kernels before 2.6.11 print fewer than eight fields; the missing ones
// are zero. At least user, nice, system and idle must be there.
func ParseProcStat(r io.Reader) (CPUTicks, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 5 {
			return CPUTicks{}, fmt.Errorf("%w: %d fields, want at least 4", ErrNoCPULine, len(f)-1)
		}
		var v [8]uint64
		for i := 0; i < len(v) && i+1 < len(f); i++ {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return CPUTicks{}, fmt.Errorf("cpu field %d: %w", i+1, err)
			}
			v[i] = n
		}
		return CPUTicks{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	if err := sc.Err(); err != nil {
		return CPUTicks{}, err
	}
	return CPUTicks{}, ErrNoCPULine
}

// atClkTck is AT_CLKTCK, the auxiliary vector's entry for USER_HZ
// (include/uapi/linux/auxvec.h).
const atClkTck = 17

// AuxvValue finds key in a Linux auxiliary vector as /proc/self/auxv
// holds it: pairs of native-endian words of the process's pointer size,
// ended by AT_NULL.
func AuxvValue(auxv []byte, key uint64) (uint64, bool) {
	word := strconv.IntSize / 8
	get := func(b []byte) uint64 {
		if word == 4 {
			return uint64(binary.NativeEndian.Uint32(b))
		}
		return binary.NativeEndian.Uint64(b)
	}
	for len(auxv) >= 2*word {
		k, v := get(auxv), get(auxv[word:])
		if k == 0 {
			break
		}
		if k == key {
			return v, true
		}
		auxv = auxv[2*word:]
	}
	return 0, false
}

// Background is how many CPUs the machine keeps busy on its own: busy time
// over d, divided by d, read while the bench does nothing. It is printed
// with the results, so a reader can tell a quiet machine's CPU numbers
// from a shared one's.
func Background(ctx context.Context, cpu CPUCounters, d time.Duration) (float64, error) {
	before, err := cpu.Machine()
	if err != nil {
		return 0, err
	}
	began := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	after, err := cpu.Machine()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(time.Since(began)), nil
}
