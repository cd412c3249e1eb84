package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// SandboxGetter is a SandboxBackend that can also read a sandbox's
// record. With one, run_command and run_code in a sandbox name the
// connections the sandbox had refused while they ran, which no other
// tool shows.
type SandboxGetter interface {
	GetSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error)
}

// maxCommandRefusals bounds the refused connections a command's result
// names (the newest).
const maxCommandRefusals = 5

// refusedWatch is how many connections a sandbox had had refused when a
// command in it started.
type refusedWatch struct {
	g      SandboxGetter
	id     string
	before int64
}

// watchRefused reads how many connections sandbox id has had refused so
// far; nil when b cannot read records or the sandbox has no network.
func watchRefused(ctx context.Context, b Backend, id string) *refusedWatch {
	g, ok := b.(SandboxGetter)
	if !ok {
		return nil
	}
	sb, err := g.GetSandbox(ctx, id)
	if err != nil || sb.Limits.Network == nil || len(sb.Limits.Network.Allow) == 0 {
		return nil
	}
	w := &refusedWatch{g: g, id: id}
	if sb.Network != nil {
		w.before = sb.Network.Refused
	}
	return w
}

// text names the connections refused since watchRefused, each with why,
// the newest maxCommandRefusals only; "" when there were none or the
// record cannot be read.
func (w *refusedWatch) text(ctx context.Context) string {
	if w == nil {
		return ""
	}
	sb, err := w.g.GetSandbox(ctx, w.id)
	if err != nil || sb.Network == nil || sb.Network.Refused <= w.before {
		return ""
	}
	n := sb.Network.Refused - w.before
	var refused []egress.Attempt
	for _, a := range sb.Network.Attempts {
		if !a.Allowed {
			refused = append(refused, a)
		}
	}
	// Attempts are oldest first; the record keeps only the newest.
	refused = refused[max(0, len(refused)-int(min(n, maxCommandRefusals))):]
	var b strings.Builder
	fmt.Fprintf(&b, "network: %d connection(s) refused while it ran", n)
	if int64(len(refused)) < n {
		fmt.Fprintf(&b, "; the newest %d:", len(refused))
	}
	b.WriteString("\n")
	for _, a := range refused {
		b.WriteString(attemptLine(a) + "\n")
	}
	return b.String()
}

// attemptLine is a refused or cut connection as a result names it.
func attemptLine(a egress.Attempt) string {
	what := "refused"
	if a.Allowed {
		what = "cut"
	}
	return fmt.Sprintf("%s: %s:%d (%s): %s", what, a.Host, a.Port, a.Kind, a.Reason)
}
