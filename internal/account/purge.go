package account

import (
	"context"
	"time"
)

// PurgeInterval is how often a server deletes expired sessions and used
// or expired one-time links. They are refused from the moment they expire
// or are used (the store compares with the clock on every lookup); the
// purge only keeps the tables small, so once an hour is enough.
const PurgeInterval = time.Hour

// Purge deletes the sessions expired by now and the links used or expired
// by now, on the service's clock.
func (s *Service) Purge(ctx context.Context) (sessions, tokens int64, err error) {
	return s.st.PurgeExpired(ctx, s.now().UTC())
}

// PurgeEvery runs Purge at once and then every interval until ctx ends;
// every node of a PostgreSQL pair may run it (deleting twice is harmless).
func (s *Service) PurgeEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		sessions, tokens, err := s.Purge(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("purging expired sessions and links", "error", err)
		case sessions+tokens > 0:
			s.log.Info("purged expired sessions and links", "sessions", sessions, "links", tokens)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
