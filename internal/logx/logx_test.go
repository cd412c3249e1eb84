package logx

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDemoteInfo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		min      slog.Level // the wrapped handler's level
		logged   slog.Level
		want     string // what reaches the wrapped handler; "" for nothing
		withAttr bool
	}{
		{name: "info is dropped at the info level", min: slog.LevelInfo, logged: slog.LevelInfo},
		{name: "info arrives as debug at the debug level", min: slog.LevelDebug, logged: slog.LevelInfo, want: "level=DEBUG msg=m\n"},
		{name: "debug stays debug", min: slog.LevelDebug, logged: slog.LevelDebug, want: "level=DEBUG msg=m\n"},
		{name: "warn passes", min: slog.LevelInfo, logged: slog.LevelWarn, want: "level=WARN msg=m\n"},
		{name: "error passes", min: slog.LevelWarn, logged: slog.LevelError, want: "level=ERROR msg=m\n"},
		{name: "attrs and groups keep the demotion", min: slog.LevelDebug, logged: slog.LevelInfo, withAttr: true, want: "level=DEBUG msg=m a=1 g.b=2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			h := slog.NewTextHandler(&buf, &slog.HandlerOptions{
				Level: tc.min,
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					if a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				},
			})
			l := slog.New(DemoteInfo(h))
			if tc.withAttr {
				l = l.With("a", 1).WithGroup("g")
				l.Log(t.Context(), tc.logged, "m", "b", 2)
			} else {
				l.Log(t.Context(), tc.logged, "m")
			}
			if diff := cmp.Diff(tc.want, buf.String()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
