// Package logx holds slog handlers shared by the packages that hand a
// logger to a library.
package logx

import (
	"context"
	"log/slog"
)

// DemoteInfo returns a handler that passes a library's INFO records to h
// at DEBUG, and every other level unchanged. Libraries log their own
// bookkeeping at INFO (River: each migration, the client starting and
// stopping; the MCP SDK: a connect and disconnect per stateless request),
// which is no news for an operator and buries what is.
func DemoteInfo(h slog.Handler) slog.Handler { return demoteInfo{h} }

type demoteInfo struct{ slog.Handler }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

func (h demoteInfo) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, demote(l))
}

func (h demoteInfo) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return h.Handler.Handle(ctx, r)
}

func (h demoteInfo) WithAttrs(as []slog.Attr) slog.Handler {
	return demoteInfo{h.Handler.WithAttrs(as)}
}

func (h demoteInfo) WithGroup(name string) slog.Handler {
	return demoteInfo{h.Handler.WithGroup(name)}
}
