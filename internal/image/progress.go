package image

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress shows the steps of a build as they run, with the time each one
// takes. On a terminal the current step is one line redrawn in place (with
// live detail such as debootstrap's package counts); anywhere else (CI logs,
// a pipe) every event is a plain line and nothing is redrawn, so the log
// stays readable.
type Progress struct {
	w     io.Writer
	tty   bool
	now   func() time.Time
	total int
	width int

	mu     sync.Mutex
	begun  time.Time
	n      int // 1-based number of the current step
	name   string
	start  time.Time
	detail string
	open   bool
	frame  int
	stop   chan struct{}
	done   chan struct{}
}

// ProgressOptions configure a Progress.
type ProgressOptions struct {
	// TTY selects in-place redrawing; false gives one line per event.
	TTY bool
	// Steps is the number of steps announced as "[n/Steps]".
	Steps int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Refresh is how often a TTY display redraws to advance the elapsed
	// time. Zero disables the background redraw (tests).
	Refresh time.Duration
	// Width is the terminal's width: the live line is cut to fit, since a
	// wrapped line cannot be redrawn in place. Zero means 100.
	Width int
}

// NewProgress returns a display writing to w. Call Close when done.
func NewProgress(w io.Writer, opts ProgressOptions) *Progress {
	if w == nil {
		w = io.Discard
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Width <= 0 {
		opts.Width = 100
	}
	p := &Progress{w: w, tty: opts.TTY, now: opts.Now, total: opts.Steps, width: opts.Width, begun: opts.Now()}
	if opts.TTY && opts.Refresh > 0 {
		p.stop, p.done = make(chan struct{}), make(chan struct{})
		go p.tick(opts.Refresh)
	}
	return p
}

func (p *Progress) tick(every time.Duration) {
	defer close(p.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			if p.open {
				p.frame++
				p.redrawLocked()
			}
			p.mu.Unlock()
		}
	}
}

// Close stops the background redraw and ends an open TTY line.
func (p *Progress) Close() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.open {
		fmt.Fprint(p.w, "\n")
		p.open = false
	}
}

// Step finishes the current step (as successful) and starts the next one.
func (p *Progress) Step(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		p.finishLocked("ok", "")
	}
	p.n++
	p.name, p.detail, p.start, p.open = name, "", p.now(), true
	if p.tty {
		p.redrawLocked()
		return
	}
	fmt.Fprintf(p.w, "%s %s ...\n", p.counter(), name)
}

// Detail sets the live detail of the current step. Only a terminal shows
// it; logs get Notes instead, so they do not fill with counters.
func (p *Progress) Detail(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.detail = s
	if p.tty && p.open {
		p.redrawLocked()
	}
}

// Note prints a line that stays, under the current step.
func (p *Progress) Note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.open {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "      %s\n", s)
	if p.tty && p.open {
		p.redrawLocked()
	}
}

// Done finishes the current step successfully, with an optional result.
func (p *Progress) Done(result string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		p.finishLocked("ok", result)
	}
}

// Skip finishes the current step as skipped, saying why.
func (p *Progress) Skip(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		p.finishLocked("skipped", why)
	}
}

// Fail finishes the current step as failed.
func (p *Progress) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		p.finishLocked("FAILED", err.Error())
	}
}

// Elapsed is the time since the display was created.
func (p *Progress) Elapsed() time.Duration { return p.now().Sub(p.begun) }

func (p *Progress) finishLocked(state, result string) {
	line := fmt.Sprintf("%s %s: %s (%s)", p.counter(), p.name, state, FormatDuration(p.now().Sub(p.start)))
	if result != "" {
		line += " " + result
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.open, p.detail = false, ""
}

var spinner = []string{"|", "/", "-", "\\"}

func (p *Progress) redrawLocked() {
	line := RenderStepLine(p.n, p.total, p.name, p.detail, p.now().Sub(p.start))
	if r := []rune(line); len(r) > p.width-3 {
		line = string(r[:max(0, p.width-4)]) + "…"
	}
	fmt.Fprintf(p.w, "\r\033[K%s %s", spinner[p.frame%len(spinner)], line)
}

func (p *Progress) counter() string {
	if p.total > 0 {
		return fmt.Sprintf("[%d/%d]", p.n, p.total)
	}
	return fmt.Sprintf("[%d]", p.n)
}

// RenderStepLine is the live line of a running step:
// "[3/8] debootstrap bookworm  unpacking 45/130  0:32".
func RenderStepLine(n, total int, name, detail string, elapsed time.Duration) string {
	var b strings.Builder
	if total > 0 {
		fmt.Fprintf(&b, "[%d/%d] %s", n, total, name)
	} else {
		fmt.Fprintf(&b, "[%d] %s", n, name)
	}
	if detail != "" {
		b.WriteString("  ")
		b.WriteString(detail)
	}
	b.WriteString("  ")
	b.WriteString(FormatDuration(elapsed))
	return b.String()
}

// FormatDuration renders a step time: "0.4s", "12.3s", "1m05s".
func FormatDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
}
