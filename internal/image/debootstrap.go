package image

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// debootstrapPhase is one stage of a debootstrap run as we show it.
type debootstrapPhase string

const (
	phaseIndex     debootstrapPhase = "reading the archive index"
	phaseResolve   debootstrapPhase = "resolving dependencies"
	phaseDownload  debootstrapPhase = "fetching"
	phaseExtract   debootstrapPhase = "extracting"
	phaseInstall   debootstrapPhase = "installing core packages"
	phaseUnpack    debootstrapPhase = "unpacking"
	phaseConfigure debootstrapPhase = "configuring"
	phaseDone      debootstrapPhase = "base system installed"
)

// debootstrapSummary condenses debootstrap's hundreds of "I: Retrieving
// foo 1.2" lines into a phase and a package count, so the display shows
// "unpacking 45/130" instead of a scrolling wall, and a log gets one line
// per phase.
type debootstrapSummary struct {
	phase   debootstrapPhase
	counts  map[debootstrapPhase]int
	fetched map[string]bool // packages downloaded or found in the cache
	last    string          // package most recently named
	tail    []string
}

func newDebootstrapSummary() *debootstrapSummary {
	return &debootstrapSummary{counts: make(map[debootstrapPhase]int), fetched: make(map[string]bool)}
}

// tailLines is how much raw output is kept for an error message.
const tailLines = 30

// Feed takes one line of debootstrap output. It returns the live detail to
// show, and a note to print when a phase ended or debootstrap warned.
func (s *debootstrapSummary) Feed(line string) (detail, note string) {
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return s.Detail(), ""
	}
	s.tail = append(s.tail, line)
	if len(s.tail) > tailLines {
		s.tail = s.tail[len(s.tail)-tailLines:]
	}
	tag, msg, ok := strings.Cut(line, ": ")
	if !ok {
		return s.Detail(), "" // wget -nv and dpkg chatter: kept in the tail only
	}
	switch tag {
	case "W":
		return s.Detail(), "debootstrap warning: " + msg
	case "E":
		return s.Detail(), "debootstrap error: " + msg
	case "I":
	default:
		return s.Detail(), ""
	}
	next, pkg := classifyInfo(msg)
	if next == "" {
		return s.Detail(), ""
	}
	if next != s.phase {
		note = s.phaseNote()
		s.phase = next
	}
	if pkg != "" {
		s.last = pkg
		if next == phaseDownload {
			// Retrieving then Validating, or only Validating when the
			// package came from --cache-dir: count each package once.
			s.fetched[pkg] = true
			s.counts[next] = len(s.fetched)
		} else {
			s.counts[next]++
		}
	}
	return s.Detail(), note
}

// classifyInfo maps an "I:" message to a phase and, for per-package
// messages, the package name.
func classifyInfo(msg string) (debootstrapPhase, string) {
	verb, rest, _ := strings.Cut(msg, " ")
	name, _, _ := strings.Cut(strings.TrimSuffix(rest, "..."), " ")
	switch {
	case msg == "Base system installed successfully.":
		return phaseDone, ""
	case strings.HasPrefix(msg, "Resolving dependencies"), strings.HasPrefix(msg, "Found additional"),
		strings.HasPrefix(msg, "Checking component"):
		return phaseResolve, ""
	case strings.HasPrefix(msg, "Installing core packages"):
		return phaseInstall, ""
	case msg == "Unpacking required packages...", msg == "Unpacking the base system...":
		return phaseUnpack, ""
	case msg == "Configuring required packages...", msg == "Configuring the base system...":
		return phaseConfigure, ""
	case verb == "Retrieving" || verb == "Validating":
		switch name {
		case "InRelease", "Release", "Release.gpg", "Packages":
			return phaseIndex, ""
		}
		return phaseDownload, name
	case verb == "Checking" || verb == "Valid":
		return phaseIndex, ""
	case verb == "Extracting":
		return phaseExtract, name
	case verb == "Unpacking":
		return phaseUnpack, name
	case verb == "Configuring":
		return phaseConfigure, name
	}
	return "", ""
}

// Detail is the live line: "unpacking 45/130 (python3.11)".
func (s *debootstrapSummary) Detail() string {
	if s.phase == "" {
		return "starting"
	}
	n := s.counts[s.phase]
	switch s.phase {
	case phaseDownload:
		return fmt.Sprintf("%s %s (%s)", s.phase, packages(n), s.last)
	case phaseExtract, phaseUnpack, phaseConfigure:
		if n == 0 {
			return string(s.phase)
		}
		// Unpacking and configuring run twice (required, then base), so
		// the count can pass the download total; cap it for display.
		total := len(s.fetched)
		if total == 0 {
			return fmt.Sprintf("%s %d (%s)", s.phase, n, s.last)
		}
		return fmt.Sprintf("%s %d/%d (%s)", s.phase, min(n, total), total, s.last)
	}
	return string(s.phase)
}

// phaseNote summarises the phase that just ended, for logs.
func (s *debootstrapSummary) phaseNote() string {
	if s.phase == "" {
		return ""
	}
	if n := s.counts[s.phase]; n > 0 {
		return fmt.Sprintf("debootstrap: %s: %s", s.phase, packages(n))
	}
	return "debootstrap: " + string(s.phase)
}

func packages(n int) string {
	if n == 1 {
		return "1 package"
	}
	return fmt.Sprintf("%d packages", n)
}

// Finish returns the note for the last phase.
func (s *debootstrapSummary) Finish() string { return s.phaseNote() }

// Tail is the last raw lines, for an error message.
func (s *debootstrapSummary) Tail() []string { return append([]string(nil), s.tail...) }

// debootstrapArgs is the command line that builds the base system.
func debootstrapArgs(o Options, target string) []string {
	args := []string{
		"--variant=minbase",
		"--components=main",
		// python3 (not python3-minimal) brings the full standard library;
		// libstdc++6 is what the official node binary links against.
		"--include=" + strings.Join(includePackages(o), ","),
	}
	if o.CacheDir != "" {
		args = append(args, "--cache-dir="+o.CacheDir)
	}
	return append(args, o.Suite, target, o.Mirror)
}

// basePackages are added to minbase (which already has bash): the
// interpreters' needs, then the Tools that shell scripts expect.
var basePackages = append([]string{"python3", "ca-certificates", "libstdc++6"}, toolPackages()...)

// includePackages is basePackages, then what o asks for: its --apt
// packages, and pip when wheels are to be installed.
func includePackages(o Options) []string {
	out := append([]string(nil), basePackages...)
	if o.Wheelhouse != "" && !slices.Contains(o.Apt, "python3-pip") {
		out = append(out, "python3-pip")
	}
	return append(out, o.Apt...)
}

// runDebootstrap runs debootstrap into target, feeding its output to the
// progress display. On failure the error carries the last lines of output.
func runDebootstrap(ctx context.Context, o Options, target string, p *Progress) error {
	if o.CacheDir != "" {
		if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
			return fmt.Errorf("creating package cache: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, o.debootstrapPath, debootstrapArgs(o, target)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C", "DEBIAN_FRONTEND=noninteractive")
	// debootstrap runs wget, dpkg and chroot; on cancel the whole group goes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw

	sum := newDebootstrapSummary()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			detail, note := sum.Feed(sc.Text())
			if note != "" {
				p.Note(note)
			}
			p.Detail(detail)
		}
		io.Copy(io.Discard, pr) // never block debootstrap on a long line
	}()
	if err := cmd.Start(); err != nil {
		pw.Close()
		wg.Wait()
		return fmt.Errorf("starting debootstrap: %w", err)
	}
	err := cmd.Wait()
	pw.Close()
	wg.Wait()
	if err == nil {
		if note := sum.Finish(); note != "" {
			p.Note(note)
		}
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	tail := sum.Tail()
	if log, rerr := os.ReadFile(filepath.Join(target, "debootstrap", "debootstrap.log")); rerr == nil {
		lines := strings.Split(strings.TrimSpace(string(log)), "\n")
		tail = append(tail, "--- debootstrap.log:")
		tail = append(tail, lines[max(0, len(lines)-15):]...)
	}
	return &CommandError{Cmd: "debootstrap " + strings.Join(debootstrapArgs(o, target), " "), Err: err, Tail: tail}
}

// CommandError is a failed external command with the end of its output.
type CommandError struct {
	Cmd  string
	Err  error
	Tail []string
}

func (e *CommandError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v", e.Cmd, e.Err)
	if len(e.Tail) > 0 {
		b.WriteString("\nlast output:\n  ")
		b.WriteString(strings.Join(e.Tail, "\n  "))
	}
	return b.String()
}

func (e *CommandError) Unwrap() error { return e.Err }
