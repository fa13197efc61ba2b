package hostroute

import (
	"context"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// ReadRegion is the read of the region's host table before the first
// request (ReadConsul).
func (r *Router) ReadRegion(reg string, c Consul) func(ctx context.Context, client *region.Client) {
	return func(ctx context.Context, client *region.Client) {
		r.ReadConsul(ctx, func(ctx context.Context) ([]byte, error) {
			doc, _, err := client.Hosts(ctx, reg)
			return doc, err
		}, c)
	}
}

// WatchConsul is the watch of the PoP's host table: each document is
// applied (ApplyConsul), and the edge registered again (the table's
// version is registered).
func (r *Router) WatchConsul(reg, pop string, c Consul) func(ctx context.Context, client *region.Client, onErr func(error)) {
	return func(ctx context.Context, client *region.Client, onErr func(error)) {
		client.WatchPoPHosts(ctx, reg, pop, func(doc []byte, _ uint64, canary bool) {
			r.ApplyConsul(doc, canary, c)
			c.Changed()
		}, onErr)
	}
}
