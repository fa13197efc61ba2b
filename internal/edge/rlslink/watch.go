package rlslink

import (
	"context"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// ReadConsul reads the region's documents before the first request; when
// Consul cannot give them, the service serves the cached ones.
func (s *Service) ReadConsul(ctx context.Context, client *region.Client, reg string, c Consul) {
	if _, err := client.ReadRLS(ctx, reg); err != nil {
		if cerr := s.LoadCache(client.Layout().RLS(reg), c); cerr != nil {
			s.log.Warn("no rate limit service documents from consul nor from the cache: answering UNAVAILABLE until consul does", "err", err, "cache_err", cerr)
		}
	}
}

// WatchConsul is the watch of the region's documents: each set is
// applied (ApplyConsul) with what c gives when the watch starts.
func (s *Service) WatchConsul(reg string, c func() Consul) func(ctx context.Context, client *region.Client, onErr func(error)) {
	return func(ctx context.Context, client *region.Client, onErr func(error)) {
		prefix := client.Layout().RLS(reg)
		rc := c()
		client.WatchRLS(ctx, reg, func(docs map[string][]byte) { s.ApplyConsul(prefix, docs, rc) }, onErr)
	}
}
