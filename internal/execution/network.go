package execution

import (
	"errors"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
)

// Network is what a sandbox, one-shot or live, may reach (package
// egress): its allowlist and its byte cap. A nil *Network is no network.
type Network struct {
	Allow    []string `json:"allow"`
	MaxBytes int64    `json:"max_bytes"`
}

// NetworkRequest is a request's "network": the allowlist it asks for,
// which must be within its plan's. An empty Allow ([]) is no network; a
// nil one (allow left out or null) is refused, so that a client that
// meant the plan's list does not silently get none.
type NetworkRequest struct {
	Allow []string `json:"allow"`
}

// NetworkFor is the network a request on p asking for r gets: the plan's
// when r is nil, r's allowlist when the plan covers it, none when r asks
// for none, else a 403 (wider than the plan) or a 400 (a malformed rule).
func NetworkFor(p config.Plan, r *NetworkRequest) (*Network, error) {
	pol := p.EgressPolicy()
	if r == nil {
		if !pol.Enabled() {
			return nil, nil
		}
		return &Network{Allow: pol.Strings(), MaxBytes: pol.MaxBytes}, nil
	}
	if r.Allow == nil {
		return nil, Errorf(KindInvalidRequest, "network.allow is required: a list of rules, or [] for no network (leave network out for your plan's list)")
	}
	if len(r.Allow) == 0 {
		return nil, nil
	}
	if !pol.Enabled() {
		return nil, Errorf(KindForbidden, "your plan allows no network; leave network out")
	}
	n, err := pol.Narrow(r.Allow)
	if errors.Is(err, egress.ErrWiden) {
		return nil, Errorf(KindForbidden, "network.allow names what your plan does not allow (%s); your plan allows %s", strings.TrimPrefix(err.Error(), egress.ErrWiden.Error()+": "), strings.Join(pol.Strings(), ", "))
	}
	if err != nil {
		return nil, Errorf(KindInvalidRequest, "network.allow: %v", err)
	}
	return &Network{Allow: n.Strings(), MaxBytes: n.MaxBytes}, nil
}

// NetworkWithin is kept (a stored sandbox's network) cut down to what p
// allows now, for a sandbox that starts again (a resume): each kept rule
// p's policy covers stays, the others are dropped (returned as written);
// the byte cap is the smaller of the two (0 is no cap). Nil when nothing
// stays or p allows no network. It never widens kept.
func NetworkWithin(p config.Plan, kept *Network) (n *Network, dropped []string) {
	if kept == nil {
		return nil, nil
	}
	pol := p.EgressPolicy()
	var allow []string
	for _, r := range kept.Allow {
		if _, err := pol.Narrow([]string{r}); pol.Enabled() && err == nil {
			allow = append(allow, r)
		} else {
			dropped = append(dropped, r)
		}
	}
	if len(allow) == 0 {
		return nil, dropped
	}
	maxBytes := kept.MaxBytes
	if maxBytes == 0 || pol.MaxBytes != 0 && pol.MaxBytes < maxBytes {
		maxBytes = pol.MaxBytes
	}
	return &Network{Allow: allow, MaxBytes: maxBytes}, dropped
}

// NetworkRecord is what an execution with a network reached, as stored
// with it (store.Execution.Network) and shown as its "network": its
// allowlist and its traffic (the newest egress.MaxAttempts attempts).
type NetworkRecord struct {
	Allow []string `json:"allow"`
	egress.Usage
}
