package region

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// KindRLS is the history kind of a rate limit service document.
const KindRLS = "rls"

// RLS is the prefix of a region's rate limit service documents:
// envoyproxy/ratelimit's YAML, one domain each, at rls/<region>/<name>.yaml
// (the edges of the region read every one, as --rls-config-dir reads a
// directory).
func (l Layout) RLS(region string) string { return l.Prefix + "rls/" + region + "/" }

// RLSDoc is one of them.
func (l Layout) RLSDoc(region, name string) string { return l.RLS(region) + name }

// RLSDocs are a region's rate limit service documents by name (the key
// without the prefix), with their ModifyIndex.
type RLSDocs struct {
	Docs  map[string][]byte
	Index map[string]uint64
}

// ReadRLS reads a region's rate limit service documents.
func (c *Client) ReadRLS(ctx context.Context, region string) (RLSDocs, error) {
	prefix := c.layout.RLS(region)
	pairs, meta, err := c.api.KV().List(prefix, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return RLSDocs{}, classifyIn(region, "reading rate limit service documents of "+region, err)
	}
	if err := filtered("reading rate limit service documents of "+region, meta); err != nil {
		return RLSDocs{}, err
	}
	d := RLSDocs{Docs: map[string][]byte{}, Index: map[string]uint64{}}
	for _, p := range pairs {
		name := strings.TrimPrefix(p.Key, prefix)
		if name == "" || strings.HasSuffix(name, "/") {
			continue // a folder
		}
		d.Docs[name], d.Index[name] = p.Value, p.ModifyIndex
	}
	return d, nil
}

// WatchRLS calls fn with the region's rate limit service documents by
// name now and after every change of them.
func (c *Client) WatchRLS(ctx context.Context, region string, fn func(map[string][]byte), onErr func(error)) {
	prefix := c.layout.RLS(region)
	var last map[string][]byte
	c.watch(ctx, prefix, onErr, func(pairs api.KVPairs) error {
		docs := map[string][]byte{}
		for _, p := range pairs {
			if name := strings.TrimPrefix(p.Key, prefix); name != "" && !strings.HasSuffix(name, "/") {
				docs[name] = p.Value
			}
		}
		if last != nil && maps.EqualFunc(last, docs, func(a, b []byte) bool { return string(a) == string(b) }) {
			return nil
		}
		last = docs
		fn(docs)
		return nil
	})
}

// RLSWrite is one document of a PushRLS: its name, content, the
// ModifyIndex it must still have (0: it must not exist) and its history
// entry (Kind, Version, Author, Host, Message). Delete removes the
// document instead (Index: the one it must still have); its history entry
// holds no document.
type RLSWrite struct {
	Name   string
	Doc    []byte
	Delete bool
	Index  uint64
	Entry  Entry
}

// PushRLS writes rate limit service documents to a region in one Consul
// transaction: each key checked against its index and a history entry
// appended for each, so the region's edges see all of them or none. A
// lost race returns ErrConflict.
func (c *Client) PushRLS(ctx context.Context, region string, writes []RLSWrite) ([]Entry, error) {
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	t := now()
	var ops api.TxnOps
	entries := make([]Entry, len(writes))
	for i, w := range writes {
		e := w.Entry
		seq := strconv.FormatInt(t.UnixNano()+int64(i), 10)
		e.Seq = strings.Repeat("0", max(0, 20-len(seq))) + seq
		e.Kind, e.Region, e.Key, e.Document, e.Index = KindRLS, region, c.layout.RLSDoc(region, w.Name), string(w.Doc), 0
		if e.Time.IsZero() {
			e.Time = t.UTC()
		}
		entry, err := json.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("encoding history entry: %w", err)
		}
		entries[i] = e
		write := &api.KVTxnOp{Verb: api.KVCAS, Key: e.Key, Value: w.Doc, Index: w.Index}
		if w.Delete {
			write = &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: e.Key, Index: w.Index}
		}
		ops = append(ops,
			&api.TxnOp{KV: write},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: c.layout.History(region) + e.Seq}},
			&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: c.layout.History(region) + e.Seq, Value: entry}},
		)
	}
	ok, resp, _, err := c.api.Txn().Txn(ops, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return nil, classifyIn(region, "pushing rate limit service documents to "+region, err)
	}
	if !ok {
		var why []string
		if resp != nil {
			for _, te := range resp.Errors {
				why = append(why, te.What)
			}
		}
		if strings.Contains(strings.ToLower(strings.Join(why, "; ")), "permission denied") {
			return nil, fmt.Errorf("pushing rate limit service documents to %s: %w", region, ErrPermissionDenied)
		}
		return nil, fmt.Errorf("pushing rate limit service documents to %s: %w (%s)", region, ErrConflict, strings.Join(why, "; "))
	}
	return entries, nil
}
