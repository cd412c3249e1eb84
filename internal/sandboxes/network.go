package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// A sandbox's network (docs/SECURITY.md, "Egress"). A sandbox keeps its
// network namespace without interfaces but lo whatever its plan; one
// whose plan (narrowed by its create) allows egress gets an
// egress.Proxy of its own, served by this process on a unix socket in a
// per-sandbox host directory that the driver mounts read-only at
// engine.EgressDir. Inside, the agent relays 127.0.0.1:engine.EgressPort
// to that socket, and HTTP_PROXY and HTTPS_PROXY name it. Nothing else
// leaves: no route, no DNS (the proxy resolves names), no UDP.
//
// A pre-started sandbox has the empty directory and no proxy; the
// create that takes it starts its proxy with the create's own policy
// before handing it over (adopt), so the warm pool never carries one
// tenant's network to another.

// Network is limits.network: what a sandbox may reach (the same as a
// one-shot execution's).
type Network = execution.Network

// NetworkRequest is a create's "network": the allowlist it asks for,
// which must be within its plan's. Nil Allow with a non-nil request is no
// network.
type NetworkRequest = execution.NetworkRequest

// NetworkUsage is a running sandbox's traffic in its current live
// period: the bytes of its closed connections and its last attempts.
type NetworkUsage = egress.Usage

// egressDir is the host directory of sandbox id's socket; "" without
// egress.
func (s *Service) egressDir(id string) string {
	if s.opts.Egress == nil {
		return ""
	}
	return s.opts.Egress.Dir(id)
}

// openNetwork starts b's proxy with network nw and has the agent relay to
// it; the caller then sets the proxy environment (engine.ProxyEnv).
func (s *Service) openNetwork(ctx context.Context, b *box, id, tenant string, nw *Network) error {
	if s.opts.Egress == nil {
		return errors.New("this server has no egress directory")
	}
	pol, err := egress.Parse(nw.Allow, nw.MaxBytes)
	if err != nil {
		return err
	}
	n, err := s.opts.Egress.Open(id, pol, s.log.With("sandbox_id", id, "tenant", tenant))
	if err != nil {
		return err
	}
	b.net = n
	if err := b.ag.Egress(ctx, engine.EgressSocket, engine.EgressPort); err != nil {
		return fmt.Errorf("starting the agent's relay: %w", err)
	}
	return nil
}

// closeNetwork cuts b's connections and removes its socket directory.
func (s *Service) closeNetwork(id string, b *box) {
	var err error
	if b.net != nil {
		err = b.net.Close()
	} else if dir := s.egressDir(id); dir != "" {
		err = os.RemoveAll(dir)
	}
	if err != nil {
		s.log.Error("removing a sandbox's egress directory", "sandbox_id", id, "error", err)
	}
}
