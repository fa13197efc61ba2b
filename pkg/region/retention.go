package region

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// DefaultKeepHistory is how many history entries of each document a push
// keeps by default. Each entry holds the document it wrote (or, for one
// stored in parts, a manifest whose parts stay while it names them), so
// history is most of what edgeguard keeps in Consul.
const DefaultKeepHistory = 50

// maxRecentPruned bounds the entries a Pruning record lists.
const maxRecentPruned = 100

// Pruning is what history retention has done in a region, as recorded
// under Layout.HistoryPruned: the retention last applied and the entries
// it deleted.
type Pruning struct {
	// Keep is the number of entries of each document the last prune kept.
	Keep int `json:"keep"`
	// Time is when a prune last ran.
	Time time.Time `json:"time"`
	// Total counts the entries every prune so far deleted.
	Total int `json:"total"`
	// Recent are the most recently deleted entries, newest first (at most
	// 100), without their documents.
	Recent []Entry `json:"recent,omitempty"`
}

// PruneHistory deletes region's history entries beyond the newest keep of
// each document (entries are grouped by the key they wrote: the global
// document, the region document, the shedder settings), records what it
// did (see Pruning) and returns the entries it deleted, newest first.
// keep < 1 keeps everything and deletes nothing. The newest entry of each
// document records what the key holds, so it is always kept.
//
// A deleted entry can no longer be rolled back to; parts of a document
// stored in parts that no remaining entry or document names are left for
// CollectParts.
func (c *Client) PruneHistory(ctx context.Context, region string, keep int) ([]Entry, error) {
	if keep < 1 {
		return nil, nil
	}
	all, err := c.History(ctx, region, "")
	if err != nil {
		return nil, err
	}
	seen := map[string]int{}
	var pruned []Entry
	var ops api.TxnOps
	for _, e := range all { // newest first
		seen[e.Key]++
		if seen[e.Key] <= keep {
			continue
		}
		e.Document = ""
		pruned = append(pruned, e)
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: c.layout.History(region) + e.Seq}})
	}
	for batch := range slices.Chunk(ops, 64) {
		ok, resp, _, err := c.api.Txn().Txn(batch, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
		if err != nil {
			return nil, classifyIn(region, "pruning the history of "+region, err)
		}
		if !ok {
			return nil, errors.New("pruning the history of " + region + ": " + txnErrors(resp))
		}
	}

	rec, index, err := c.pruning(ctx, region)
	if err != nil {
		return pruned, err
	}
	if rec.Keep == keep && len(pruned) == 0 {
		return nil, nil // nothing to record
	}
	rec.Keep, rec.Time = keep, time.Now().UTC()
	rec.Total += len(pruned)
	rec.Recent = append(slices.Clone(pruned), rec.Recent...)
	// Newest first by index; records from before entries carried one
	// (index 0) keep their order after them.
	slices.SortStableFunc(rec.Recent, func(a, b Entry) int { return cmp.Compare(b.Index, a.Index) })
	rec.Recent = rec.Recent[:min(len(rec.Recent), maxRecentPruned)]
	data, err := json.Marshal(rec)
	if err != nil {
		return pruned, fmt.Errorf("encoding the pruning record: %w", err)
	}
	// Check-and-set, so two pushes pruning at once do not lose a count;
	// the one that loses says so, its deletions done all the same.
	ok, _, err := c.api.KV().CAS(&api.KVPair{Key: c.layout.HistoryPruned(region), Value: data, ModifyIndex: index},
		(&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return pruned, classifyIn(region, "recording the pruning of the history of "+region, err)
	}
	if !ok {
		return pruned, fmt.Errorf("recording the pruning of the history of %s: %w", region, ErrConflict)
	}
	return pruned, nil
}

// HistoryPruning reads region's pruning record (zero when nothing was ever
// pruned).
func (c *Client) HistoryPruning(ctx context.Context, region string) (Pruning, error) {
	rec, _, err := c.pruning(ctx, region)
	return rec, err
}

func (c *Client) pruning(ctx context.Context, region string) (Pruning, uint64, error) {
	var rec Pruning
	pair, _, err := c.api.KV().Get(c.layout.HistoryPruned(region), (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return rec, 0, classifyIn(region, "reading the pruning record of "+region, err)
	}
	if pair == nil {
		return rec, 0, nil
	}
	if err := json.Unmarshal(pair.Value, &rec); err != nil {
		return rec, 0, fmt.Errorf("reading the pruning record of %s: %w", region, err)
	}
	return rec, pair.ModifyIndex, nil
}

// isHistoryEntry tells entries (named by their sequence number) from the
// pruning record among the keys under Layout.History.
func isHistoryEntry(key, prefix string) bool {
	seq := strings.TrimPrefix(key, prefix)
	return seq != "" && strings.Trim(seq, "0123456789") == ""
}
