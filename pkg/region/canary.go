package region

import (
	"bytes"
	"context"
	"errors"
	"strings"

	"github.com/hashicorp/consul/api"
)

// A canary is a candidate document that one PoP's edges run before the
// rest of the region does (regionctl rules push --canary, shedder set
// --canary). Each kind's canary key sits beside the kind's own keys:
//
//	rules/canary/<region>/<pop>         the candidate region rules document (YAML)
//	rules/canary-global/<region>/<pop>  the candidate global rules document (YAML)
//	shedder/canary/<region>/<pop>       the candidate shedder settings (JSON)
//	hosts/canary/<region>/<pop>         the candidate host table (YAML)
//
// The edges of <pop> prefer it over the region's document of that kind
// (rules/regions/<region>, rules/global, shedder/<region>, hosts/<region>)
// while it exists; the other edges of the region never read it. A global
// canary stands for rules/global only: the region document still applies
// on top of it, as it does on top of rules/global. Its keys have a prefix
// of their own (canary-global, not canary/global), so no region's name can
// make one key of the two rules kinds the other's. Deleting it returns the PoP to the
// region's document. It sits under the kind's prefix, so the edges' one
// watch of that kind sees it come and go. A region runs at most one canary
// at a time, of any kind (regionctl refuses a second: two candidates at
// once could not be told apart by the verdict); should two keys exist,
// each PoP still reads only its own.

// CanaryKind is the kind of document a canary tries out.
type CanaryKind string

// The kinds of canaries.
const (
	CanaryRules   CanaryKind = "rules"
	CanaryGlobal  CanaryKind = "global" // the global rules document
	CanaryShedder CanaryKind = "shedder"
	CanaryHosts   CanaryKind = "hosts"
)

// CanaryKinds are every kind, in the order they are checked.
var CanaryKinds = []CanaryKind{CanaryRules, CanaryGlobal, CanaryShedder, CanaryHosts}

// Canaries is the prefix of a region's canary keys of kind.
func (l Layout) Canaries(kind CanaryKind, region string) string {
	if kind == CanaryGlobal {
		// Under rules/, where the edges' one watch of the rules sees it.
		return l.Prefix + "rules/canary-global/" + region + "/"
	}
	return l.Prefix + string(kind) + "/canary/" + region + "/"
}

// Canary is the canary key of kind of one PoP of a region.
func (l Layout) Canary(kind CanaryKind, region, pop string) string {
	return l.Canaries(kind, region) + pop
}

// RulesCanaries is the prefix of a region's rules canary keys.
func (l Layout) RulesCanaries(region string) string { return l.Canaries(CanaryRules, region) }

// RulesCanary is the rules canary key of one PoP of a region.
func (l Layout) RulesCanary(region, pop string) string { return l.Canary(CanaryRules, region, pop) }

// ShedderCanary is the shedder canary key of one PoP of a region.
func (l Layout) ShedderCanary(region, pop string) string {
	return l.Canary(CanaryShedder, region, pop)
}

// GlobalCanary is the global rules canary key of one PoP of a region.
func (l Layout) GlobalCanary(region, pop string) string { return l.Canary(CanaryGlobal, region, pop) }

// HostsCanary is the host table canary key of one PoP of a region.
func (l Layout) HostsCanary(region, pop string) string { return l.Canary(CanaryHosts, region, pop) }

// ErrCanaryRunning is a canary already under way in the region.
var ErrCanaryRunning = errors.New("a canary is already running in the region")

// Canary is a canary key as stored.
type Canary struct {
	Kind     CanaryKind
	PoP      string
	Key      string
	Document []byte
	Index    uint64 // the key's ModifyIndex
}

// Canaries lists the canary keys of region, of every kind.
func (c *Client) Canaries(ctx context.Context, region string) ([]Canary, error) {
	var out []Canary
	for _, kind := range CanaryKinds {
		prefix := c.layout.Canaries(kind, region)
		pairs, meta, err := c.api.KV().List(prefix, (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return nil, classifyIn(region, "reading canaries of "+region, err)
		}
		if err := filtered("reading canaries of "+region, meta); err != nil {
			return nil, err
		}
		for _, p := range pairs {
			out = append(out, Canary{Kind: kind, PoP: strings.TrimPrefix(p.Key, prefix), Key: p.Key, Document: p.Value, Index: p.ModifyIndex})
		}
	}
	return out, nil
}

// StartCanary writes doc as the canary document of kind of pop in region,
// only when the region runs no canary of any kind (ErrCanaryRunning
// otherwise; the key's own absence is checked in the write's transaction).
func (c *Client) StartCanary(ctx context.Context, kind CanaryKind, region, pop string, doc []byte) error {
	running, err := c.Canaries(ctx, region)
	if err != nil {
		return err
	}
	if len(running) > 0 {
		return ErrCanaryRunning
	}
	key := c.layout.Canary(kind, region, pop)
	ok, _, _, err := c.api.Txn().Txn(api.TxnOps{
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: doc, Index: 0}},
	}, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return classifyIn(region, "writing "+key+" in "+region, err)
	}
	if !ok {
		return ErrCanaryRunning
	}
	return nil
}

// StopCanary deletes the canary key of kind of pop in region (nothing when
// absent).
func (c *Client) StopCanary(ctx context.Context, kind CanaryKind, region, pop string) error {
	key := c.layout.Canary(kind, region, pop)
	_, err := c.api.KV().Delete(key, (&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	return classifyIn(region, "deleting "+key+" in "+region, err)
}

// ReadPoPDocs is ReadDocs for an edge of pop: the PoP's canary documents,
// when they exist, stand for the region document and the global one.
func (c *Client) ReadPoPDocs(ctx context.Context, region, pop string) (Docs, error) {
	pairs, meta, err := c.api.KV().List(c.layout.Rules(), (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return Docs{}, classifyIn(region, "reading rules of "+region, err)
	}
	if err := filtered("reading rules of "+region, meta); err != nil {
		return Docs{}, err
	}
	return c.resolveDocs(ctx, region, c.popDocsOf(pairs, region, pop))
}

// popDocsOf is docsOf with pop's canaries, when it has them, as the region
// document and the global one ("" reads no canary).
func (c *Client) popDocsOf(pairs api.KVPairs, region, pop string) Docs {
	d := c.docsOf(pairs, region)
	if pop == "" {
		return d
	}
	key, global := c.layout.RulesCanary(region, pop), c.layout.GlobalCanary(region, pop)
	for _, p := range pairs {
		switch p.Key {
		case key:
			d.Region, d.RegionIndex, d.Canary = p.Value, p.ModifyIndex, true
		case global:
			d.Global, d.GlobalIndex, d.GlobalCanary = p.Value, p.ModifyIndex, true
		}
	}
	return d
}

// WatchPoPRules is WatchRules for an edge of pop: while a rules canary key
// of pop exists, its document stands for the region document; while a
// global canary key of pop exists, its document stands for the global one.
func (c *Client) WatchPoPRules(ctx context.Context, region, pop string, fn func(Docs), onErr func(error)) {
	var last *Docs
	c.watch(ctx, c.layout.Rules(), onErr, func(pairs api.KVPairs) error {
		d := c.popDocsOf(pairs, region, pop)
		if last != nil && bytes.Equal(last.Global, d.Global) && bytes.Equal(last.Region, d.Region) && last.Canary == d.Canary && last.GlobalCanary == d.GlobalCanary {
			return nil
		}
		whole, err := c.resolveDocs(ctx, region, d)
		if errors.Is(err, ErrInvalidManifest) {
			// Refused as it stands: reading it again cannot help, so it
			// is not retried; the next change of the documents is read.
			last = &d
			return &RefusedError{Err: err}
		}
		if err != nil {
			return err
		}
		last = &d // as stored: a manifest is compared, not its parts
		fn(whole)
		return nil
	})
}
