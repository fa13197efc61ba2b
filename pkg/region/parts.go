package region

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// A rules document larger than one Consul value (kv_max_value_size, 512 KiB
// by default) is stored in parts: each part under <prefix>parts/<sha256>,
// and in the document's own key a manifest naming them in order, with their
// hashes. A push writes the parts first, then the manifest in the same
// check-and-set transaction as always, which also checks that every part is
// still there as written; so a watcher that sees a manifest finds all its
// parts, and a push interrupted between parts leaves the old manifest, and
// what the edges run, untouched. Parts are named by content, so a part that
// did not change between versions is stored once.
//
// Parts stay as long as a manifest names them: the current documents or any
// history entry kept (so rollback can restore any version history holds).
// CollectParts deletes the others: those of pushes interrupted before their
// manifest, and those of versions whose history entries were pruned
// (PruneHistory). regionctl collects only once the region's edges have
// converged on what KV holds, so no edge is still reading parts it deletes;
// and were one to, it would find a part missing, keep the rules it runs and
// read the manifest again (Resolve never returns a mix of versions).
const (
	// InlineMax is the largest document stored as one value. The push
	// transaction carries it twice (the key and the history entry), and a
	// transaction is bounded by txn_max_req_len, 512 KiB by default.
	InlineMax = 192 << 10
	// PartSize is the most a part holds. Parts are written in a transaction
	// (for their ModifyIndex), where values travel base64-encoded: 4/3 of
	// this stays under 512 KiB with room for the rest of the request.
	PartSize = 352 << 10
	// MaxParts bounds a document to what one transaction can check: a
	// Consul transaction takes 64 operations, two of which write the
	// manifest and the history entry.
	MaxParts = 62

	manifestKind = "edgeguard-rules-parts/v1"
)

// Manifest is what the document's key holds when the document is stored in
// parts.
type Manifest struct {
	Kind    string `json:"kind"`    // manifestKind
	Version string `json:"version"` // the document's version, as history records it
	Size    int    `json:"size"`    // of the whole document
	SHA256  string `json:"sha256"`  // of the whole document
	Parts   []Part `json:"parts"`
}

// Part is one stored piece of a document.
type Part struct {
	Key    string `json:"key"`
	Size   int    `json:"size"`
	SHA256 string `json:"sha256"`
}

// MaxDocument bounds a document stored in parts: what MaxParts parts of
// PartSize hold. A manifest naming more is refused before anything is
// allocated for it.
const MaxDocument = MaxParts * PartSize

// ErrInvalidManifest is a manifest that cannot name a document: a size, a
// part count or a hash out of range, a part outside the parts prefix, sizes
// that do not add up. Such a document is refused as it stands (reading it
// again cannot help); the rules in force stay.
var ErrInvalidManifest = errors.New("invalid rules manifest")

// ParseManifest returns the manifest stored in value, or nil when value is
// a document itself. Every size, count and hash is checked here, so a
// manifest it returns can be read without trusting anything in it.
func ParseManifest(value []byte) (*Manifest, error) {
	if !bytes.HasPrefix(value, []byte(`{"kind":"`+manifestKind+`"`)) {
		return nil, nil
	}
	var m Manifest
	if err := strictjson.Unmarshal(value, &m); err != nil {
		return nil, fmt.Errorf("decoding rules manifest: %w: %w", ErrInvalidManifest, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("decoding rules manifest: %w: %w", ErrInvalidManifest, err)
	}
	return &m, nil
}

// validate reports everything wrong with m at once.
func (m *Manifest) validate() error {
	var errs []error
	if m.Kind != manifestKind {
		errs = append(errs, fmt.Errorf("kind %q (want %q)", m.Kind, manifestKind))
	}
	if len(m.Parts) == 0 || len(m.Parts) > MaxParts {
		errs = append(errs, fmt.Errorf("%d parts (want 1-%d)", len(m.Parts), MaxParts))
	}
	if m.Size < 1 || m.Size > MaxDocument {
		errs = append(errs, fmt.Errorf("size %d (want 1-%d)", m.Size, MaxDocument))
	}
	if !isSHA256Hex(m.SHA256) {
		errs = append(errs, fmt.Errorf("sha256 %.80q is not 64 lowercase hex digits", m.SHA256))
	}
	total := 0
	for i, p := range m.Parts[:min(len(m.Parts), MaxParts)] {
		if p.Size < 1 || p.Size > PartSize {
			errs = append(errs, fmt.Errorf("part %d: size %d (want 1-%d)", i+1, p.Size, PartSize))
		} else {
			total += p.Size
		}
		if !isSHA256Hex(p.SHA256) {
			errs = append(errs, fmt.Errorf("part %d: sha256 %.80q is not 64 lowercase hex digits", i+1, p.SHA256))
		}
		if !strings.HasSuffix(p.Key, "parts/"+p.SHA256) {
			errs = append(errs, fmt.Errorf("part %d: key %.200q is not parts/<its sha256>", i+1, p.Key))
		}
	}
	if len(errs) == 0 && total != m.Size {
		errs = append(errs, fmt.Errorf("the parts add up to %d bytes, the manifest says %d", total, m.Size))
	}
	return errors.Join(errs...)
}

func isSHA256Hex(s string) bool {
	if len(s) != sha256.Size*2 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// SameDocument reports whether stored (a key's value or a history entry's
// document: a document or a manifest) holds doc.
func SameDocument(stored string, doc []byte) bool {
	m, err := ParseManifest([]byte(stored))
	if err != nil || m == nil {
		return err == nil && stored == string(doc)
	}
	sum := sha256.Sum256(doc)
	return m.Size == len(doc) && m.SHA256 == hex.EncodeToString(sum[:])
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// splitParts cuts doc into parts of at most PartSize bytes, at line ends
// where it can (so a part is readable on its own), and names them.
func (l Layout) splitParts(doc []byte) (Manifest, [][]byte) {
	m := Manifest{Kind: manifestKind, Size: len(doc), SHA256: sha256Hex(doc)}
	var chunks [][]byte
	for rest := doc; len(rest) > 0; {
		n := min(len(rest), PartSize)
		if n < len(rest) {
			if i := bytes.LastIndexByte(rest[:n], '\n'); i > 0 {
				n = i + 1
			}
		}
		chunk := rest[:n]
		rest = rest[n:]
		sum := sha256Hex(chunk)
		m.Parts = append(m.Parts, Part{Key: l.Parts() + sum, Size: len(chunk), SHA256: sum})
		chunks = append(chunks, chunk)
	}
	return m, chunks
}

// pushParts writes doc's parts to region and returns the manifest and the
// transaction operations that check every part is still as written. onPart
// (when set) runs before each part; its error stops the push.
func (c *Client) pushParts(ctx context.Context, region string, doc []byte, version string) (Manifest, api.TxnOps, error) {
	m, chunks := c.layout.splitParts(doc)
	m.Version = version
	if len(m.Parts) > MaxParts {
		return m, nil, fmt.Errorf("pushing rules to %s: the document is %d bytes, %d parts of at most %d bytes; at most %d parts fit one transaction",
			region, len(doc), len(m.Parts), PartSize, MaxParts)
	}
	written := map[string]uint64{}
	for i, p := range m.Parts {
		if c.onPart != nil {
			if err := c.onPart(region, i, len(m.Parts)); err != nil {
				return m, nil, fmt.Errorf("pushing rules to %s: part %d of %d: %w", region, i+1, len(m.Parts), err)
			}
		}
		if _, done := written[p.Key]; done {
			continue
		}
		ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVSet, Key: p.Key, Value: chunks[i]}}}
		ok, resp, _, err := c.api.Txn().Txn(ops, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
		if err != nil {
			return m, nil, classifyIn(region, fmt.Sprintf("pushing rules part %d of %d to %s", i+1, len(m.Parts), region), err)
		}
		if !ok || len(resp.Results) != 1 || resp.Results[0].KV == nil {
			return m, nil, fmt.Errorf("pushing rules part %d of %d to %s: %s", i+1, len(m.Parts), region, txnErrors(resp))
		}
		written[p.Key] = resp.Results[0].KV.ModifyIndex
	}
	var checks api.TxnOps
	for _, key := range slices.Sorted(maps.Keys(written)) {
		checks = append(checks, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: written[key]}})
	}
	return m, checks, nil
}

func txnErrors(resp *api.TxnResponse) string {
	if resp == nil {
		return "no response"
	}
	var why []string
	for _, te := range resp.Errors {
		why = append(why, te.What)
	}
	return strings.Join(why, "; ")
}

// Resolve returns the document stored in value: value itself, or, for a
// manifest, its parts read from region and checked against their hashes.
// A missing or altered part is an error: the caller keeps what it has.
func (c *Client) Resolve(ctx context.Context, region string, value []byte) ([]byte, error) {
	return c.resolve(region, value, func(i, n int, key string) ([]byte, error) {
		pair, _, err := c.api.KV().Get(key, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
		if err != nil {
			return nil, classifyIn(region, fmt.Sprintf("reading rules part %d of %d in %s", i+1, n, region), err)
		}
		if pair == nil {
			return nil, nil
		}
		return pair.Value, nil
	})
}

// getPart reads part i of n, stored under key: nil, nil when it is absent.
type getPart func(i, n int, key string) ([]byte, error)

// resolve is Resolve reading parts with get.
func (c *Client) resolve(region string, value []byte, get getPart) ([]byte, error) {
	m, err := ParseManifest(value)
	if err != nil || m == nil {
		return value, err
	}
	for i, p := range m.Parts {
		if !strings.HasPrefix(p.Key, c.layout.Parts()) {
			return nil, fmt.Errorf("reading rules in %s: %w: part %d: key %q is outside %s", region, ErrInvalidManifest, i+1, p.Key, c.layout.Parts())
		}
	}
	doc := make([]byte, 0, m.Size) // bounded by ParseManifest
	for i, p := range m.Parts {
		v, err := get(i, len(m.Parts), p.Key)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, fmt.Errorf("reading rules part %d of %d in %s: %s is missing", i+1, len(m.Parts), region, p.Key)
		}
		if len(v) != p.Size || sha256Hex(v) != p.SHA256 {
			return nil, fmt.Errorf("reading rules part %d of %d in %s: %s does not match its hash", i+1, len(m.Parts), region, p.Key)
		}
		doc = append(doc, v...)
	}
	if len(doc) != m.Size || sha256Hex(doc) != m.SHA256 {
		return nil, fmt.Errorf("reading rules in %s: the parts do not add up to the document the manifest names", region)
	}
	return doc, nil
}

// resolveDocs turns manifests in d into the documents they name.
func (c *Client) resolveDocs(ctx context.Context, region string, d Docs) (Docs, error) {
	var err error
	if d.Global, err = c.Resolve(ctx, region, d.Global); err != nil {
		return d, fmt.Errorf("global document: %w", err)
	}
	if d.Region, err = c.Resolve(ctx, region, d.Region); err != nil {
		return d, fmt.Errorf("region document: %w", err)
	}
	return d, nil
}

// OnPart sets a function called before each part of a document stored in
// parts is written (i from 0 to n-1): for progress, and for tests, which
// interrupt a push there by returning an error.
func (c *Client) OnPart(f func(region string, i, n int) error) { c.onPart = f }

// CollectParts deletes region's parts that no manifest names, neither the
// current documents' nor any history entry's, and returns how many: parts
// of pushes interrupted before their manifest and of versions whose history
// entries were pruned.
//
// Collecting never removes a part a committed manifest names: every
// deletion travels in a transaction that also checks the documents stored
// in parts (the rules and the host table) are still as read (their ModifyIndex, or still absent), so a push that
// commits a manifest between the read and the deletion fails the
// transaction, and the parts are read again (up to three times, then
// ErrConflict: the parts stay for a later collection). A push racing with
// it the other way loses nothing either: its manifest transaction checks
// its parts and fails as a conflict if one went.
func (c *Client) CollectParts(ctx context.Context, region string) (int, error) {
	var err error
	for range 3 {
		var n int
		if n, err = c.collectParts(ctx, region); !errors.Is(err, ErrConflict) {
			return n, err
		}
	}
	return 0, err
}

func (c *Client) collectParts(ctx context.Context, region string) (int, error) {
	unnamed, checks, err := c.unnamedParts(ctx, region)
	if err != nil || len(unnamed) == 0 {
		return 0, err
	}
	if c.beforeCollect != nil {
		c.beforeCollect()
	}
	var deletes api.TxnOps
	for _, k := range unnamed {
		deletes = append(deletes, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: k}})
	}
	n := 0
	for batch := range slices.Chunk(deletes, maxTxnOps-len(checks)) {
		ops := append(slices.Clip(checks), batch...)
		ok, resp, _, err := c.api.Txn().Txn(ops, (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
		if err != nil {
			return n, classifyIn(region, "deleting rules parts in "+region, err)
		}
		if why := txnErrors(resp); !ok && strings.Contains(strings.ToLower(why), "permission denied") {
			return n, fmt.Errorf("deleting rules parts in %s: %w (%s)", region, ErrPermissionDenied, why)
		} else if !ok {
			return n, fmt.Errorf("deleting rules parts in %s: %w (%s)", region, ErrConflict, why)
		}
		n += len(batch)
	}
	return n, nil
}

// maxTxnOps is the most operations a Consul transaction takes.
const maxTxnOps = 64

// UnnamedParts lists region's parts that no manifest names, neither the
// current documents' nor any history entry's: what CollectParts deletes.
func (c *Client) UnnamedParts(ctx context.Context, region string) ([]string, error) {
	unnamed, _, err := c.unnamedParts(ctx, region)
	return unnamed, err
}

// unnamedParts is UnnamedParts, with the transaction operations that check
// the rules documents are still as they were read: a deletion of those
// parts is safe only together with them.
func (c *Client) unnamedParts(ctx context.Context, region string) ([]string, api.TxnOps, error) {
	keys, _, err := c.api.KV().Keys(c.layout.Parts(), "", (&api.QueryOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return nil, nil, classifyIn(region, "listing rules parts in "+region, err)
	}
	if len(keys) == 0 {
		return nil, nil, nil
	}
	named := map[string]bool{}
	name := func(value []byte) error {
		m, err := ParseManifest(value)
		if m != nil {
			for _, p := range m.Parts {
				named[p.Key] = true
			}
		}
		return err
	}
	// Read after the parts were listed: a part written before the listing
	// whose manifest commits after this read fails the checks below. The
	// documents stored in parts are the rules and the host tables (the
	// region's and its canaries').
	pairs, _, err := c.api.KV().List(c.layout.Rules(), (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, nil, classifyIn(region, "reading rules of "+region, err)
	}
	hostPairs, _, err := c.api.KV().List(c.layout.hostTables(), (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, nil, classifyIn(region, "reading host tables of "+region, err)
	}
	pairs = append(pairs, hostPairs...)
	var checks api.TxnOps
	present := map[string]bool{}
	for _, p := range pairs {
		if err := name(p.Value); err != nil {
			return nil, nil, fmt.Errorf("collecting rules parts in %s: %s: %w", region, p.Key, err)
		}
		present[p.Key] = true
		checks = append(checks, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: p.Key, Index: p.ModifyIndex}})
	}
	for _, k := range []string{c.layout.GlobalRules(), c.layout.RegionRules(region), c.layout.Hosts(region)} {
		if !present[k] {
			checks = append(checks, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: k}})
		}
	}
	if len(checks) >= maxTxnOps {
		return nil, nil, fmt.Errorf("collecting rules parts in %s: %d rules documents, more than one transaction can check", region, len(pairs))
	}
	history, err := c.History(ctx, region, "")
	if err != nil {
		return nil, nil, err
	}
	for _, e := range history {
		if err := name([]byte(e.Document)); err != nil {
			return nil, nil, fmt.Errorf("collecting rules parts in %s: history entry %s: %w", region, e.Seq, err)
		}
	}
	var unnamed []string
	for _, k := range keys {
		if !named[k] {
			unnamed = append(unnamed, k)
		}
	}
	return unnamed, checks, nil
}
