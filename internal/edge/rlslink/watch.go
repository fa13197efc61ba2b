package rlslink

import (
	"context"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// ReadConsul is the read of the region's documents before the first
// request; when Consul cannot give them, the service serves the cached
// ones.
func (s *Service) ReadConsul(reg string, c Consul) func(ctx context.Context, client *region.Client) {
	return func(ctx context.Context, client *region.Client) {
		if _, err := client.ReadRLS(ctx, reg); err != nil {
			if cerr := s.LoadCache(client.Layout().RLS(reg), c); cerr != nil {
				s.log.Warn("no rate limit service documents from consul nor from the cache: answering UNAVAILABLE until consul does", "err", err, "cache_err", cerr)
			}
		}
	}
}

// WatchConsul is the watch of the region's documents: each set is
// applied (ApplyConsul).
func (s *Service) WatchConsul(reg string, c Consul) func(ctx context.Context, client *region.Client, onErr func(error)) {
	return func(ctx context.Context, client *region.Client, onErr func(error)) {
		prefix := client.Layout().RLS(reg)
		client.WatchRLS(ctx, reg, func(docs map[string][]byte) { s.ApplyConsul(prefix, docs, c) }, onErr)
	}
}
