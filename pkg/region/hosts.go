package region

import (
	"context"
	"fmt"
)

// KindHosts is the history kind of a region's host table.
const KindHosts = "hosts"

// Hosts is where a region's host table lives: one YAML document (see
// internal/hosts) mapping hostnames to origin pools, read by every edge of
// the region.
func (l Layout) Hosts(region string) string { return l.hostTables() + region }

// hostTables is the prefix of every host table key, canaries' included.
func (l Layout) hostTables() string { return l.Prefix + "hosts/" }

// Hosts reads a region's host table and its ModifyIndex (nil, 0 when
// absent). A table stored in parts (over InlineMax) is read whole.
func (c *Client) Hosts(ctx context.Context, region string) ([]byte, uint64, error) {
	v, index, err := c.Get(ctx, region, c.layout.Hosts(region))
	if err != nil || v == nil {
		return v, index, err
	}
	doc, err := c.Resolve(ctx, region, v)
	if err != nil {
		return nil, index, fmt.Errorf("host table of %s: %w", region, err)
	}
	return doc, index, nil
}

// WatchHosts calls fn with the region's host table (nil and 0 when absent)
// and its ModifyIndex now and after every change of its content, until ctx
// is done. A table stored in parts is passed whole, or not at all (as
// WatchRules). Errors go to onErr and are retried with backoff; a panic in fn
// is recovered, reported and retried the same way.
func (c *Client) WatchHosts(ctx context.Context, region string, fn func(doc []byte, index uint64), onErr func(error)) {
	c.WatchPoPHosts(ctx, region, "", func(doc []byte, index uint64, _ bool) { fn(doc, index) }, onErr)
}

// WatchPoPHosts is WatchHosts for an edge of pop: while a host table
// canary key of pop exists, its table stands for the region's, and fn is
// told so (canary true).
func (c *Client) WatchPoPHosts(ctx context.Context, region, pop string, fn func(doc []byte, index uint64, canary bool), onErr func(error)) {
	c.watchPoP(ctx, CanaryHosts, c.layout.Hosts(region), region, pop, fn, onErr)
}
