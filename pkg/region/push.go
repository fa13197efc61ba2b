package region

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Kinds of documents a history entry records.
const (
	KindGlobalRules = "rules/global"
	KindRegionRules = "rules/region"
	KindShedder     = "shedder"
)

// Entry is one push, as kept in the region's history.
type Entry struct {
	Seq      string    `json:"seq"`
	Kind     string    `json:"kind"`
	Region   string    `json:"region"`
	Key      string    `json:"key"`
	Version  string    `json:"version"` // content hash of the pushed document
	Author   string    `json:"author"`
	Host     string    `json:"host"`
	Time     time.Time `json:"time"`
	Message  string    `json:"message,omitempty"`
	Document string    `json:"document"` // what was written, so a rollback can restore it
	// Index is the ModifyIndex of the entry's key, set when history is
	// read: what orders entries. Seq names the key and Time is the
	// pusher's clock; neither orders pushes from hosts whose clocks differ.
	Index uint64 `json:"index,omitempty"`
}

// Push writes doc to key in region's datacenter if the key's ModifyIndex is
// still casIndex (0: the key must not exist), and appends entry to the
// region's history — both in one Consul transaction, so a push is recorded
// exactly when it lands. A lost race returns ErrConflict.
//
// A rules document over InlineMax is stored in parts (see parts.go): the
// parts are written first, and the transaction then writes the manifest
// instead of the document, recorded as such in the history entry, and also
// checks that every part is still as written.
func (c *Client) Push(ctx context.Context, region, key string, doc []byte, casIndex uint64, e Entry) (Entry, error) {
	value := doc
	var ops api.TxnOps
	if len(doc) > InlineMax && e.Kind != KindShedder {
		m, checks, err := c.pushParts(ctx, region, doc, e.Version)
		if err != nil {
			return e, err
		}
		if value, err = json.Marshal(m); err != nil {
			return e, fmt.Errorf("encoding rules manifest: %w", err)
		}
		ops = checks
	}
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	e.Seq = strconv.FormatInt(now().UnixNano(), 10)
	e.Seq = strings.Repeat("0", max(0, 20-len(e.Seq))) + e.Seq // a name, not an order
	e.Region, e.Key, e.Document, e.Index = region, key, string(value), 0
	if e.Time.IsZero() {
		e.Time = now().UTC()
	}
	entry, err := json.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("encoding history entry: %w", err)
	}
	ops = append(ops,
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: value, Index: casIndex}},
		// Never overwrite another push's entry (two clocks giving one name).
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: c.layout.History(region) + e.Seq}},
		&api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: c.layout.History(region) + e.Seq, Value: entry}},
	)
	ok, resp, _, err := c.api.Txn().Txn(ops, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return e, classifyIn(region, "pushing "+key+" to "+region, err)
	}
	if !ok {
		var why []string
		if resp != nil {
			for _, te := range resp.Errors {
				why = append(why, te.What)
			}
		}
		if len(why) > 0 && strings.Contains(strings.ToLower(strings.Join(why, "; ")), "permission denied") {
			return e, fmt.Errorf("pushing %s to %s: %w", key, region, ErrPermissionDenied)
		}
		return e, fmt.Errorf("pushing %s to %s: %w (%s)", key, region, ErrConflict, strings.Join(why, "; "))
	}
	return e, nil
}

// History lists a region's entries, newest first; kind "" means every kind.
func (c *Client) History(ctx context.Context, region, kind string) ([]Entry, error) {
	pairs, meta, err := c.api.KV().List(c.layout.History(region), (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return nil, classifyIn(region, "reading history of "+region, err)
	}
	if err := filtered("reading history of "+region, meta); err != nil {
		return nil, err
	}
	var out []Entry
	for _, p := range pairs {
		if !isHistoryEntry(p.Key, c.layout.History(region)) {
			continue // the pruning record
		}
		var e Entry
		if err := json.Unmarshal(p.Value, &e); err != nil {
			return nil, fmt.Errorf("history entry %s: %w", p.Key, err)
		}
		if kind == "" || e.Kind == kind {
			e.Index = p.ModifyIndex
			out = append(out, e)
		}
	}
	// Newest first by Consul's index: the order the pushes landed in,
	// whatever the pushers' clocks said.
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(b.Index, a.Index), strings.Compare(b.Seq, a.Seq))
	})
	return out, nil
}
