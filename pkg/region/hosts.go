package region

import (
	"bytes"
	"context"

	"github.com/hashicorp/consul/api"
)

// KindHosts is the history kind of a region's host table.
const KindHosts = "hosts"

// Hosts is where a region's host table lives: one YAML document (see
// internal/hosts) mapping hostnames to origin pools, read by every edge of
// the region.
func (l Layout) Hosts(region string) string { return l.Prefix + "hosts/" + region }

// Hosts reads a region's host table and its ModifyIndex (nil, 0 when
// absent).
func (c *Client) Hosts(ctx context.Context, region string) ([]byte, uint64, error) {
	return c.Get(ctx, region, c.layout.Hosts(region))
}

// WatchHosts calls fn with the region's host table (nil and 0 when absent)
// and its ModifyIndex now and after every change of its content, until ctx
// is done. Errors go to onErr and are retried with backoff; a panic in fn
// is recovered, reported and retried the same way.
func (c *Client) WatchHosts(ctx context.Context, region string, fn func(doc []byte, index uint64), onErr func(error)) {
	key := c.layout.Hosts(region)
	var last []byte
	first := true
	c.watch(ctx, key, onErr, func(pairs api.KVPairs) error {
		var v []byte
		var index uint64
		for _, p := range pairs {
			if p.Key == key { // not hosts/<region>-2
				v, index = p.Value, p.ModifyIndex
			}
		}
		if !first && bytes.Equal(v, last) {
			return nil
		}
		first, last = false, v
		fn(v, index)
		return nil
	})
}
