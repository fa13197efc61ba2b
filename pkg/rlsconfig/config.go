package rlsconfig

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Limit is what applies to a matched descriptor: plain values, no counting.
type Limit struct {
	// Path names the descriptor (domain.key_value.key), for logs and errors.
	Path string
	// Name and Replaces: a matched limit whose Name another matched limit
	// of the same request replaces is not applied.
	Name     string
	Replaces []string
	// Unlimited descriptors are answered OK without counting.
	Unlimited bool
	Shadow    bool
	Quota     bool
	// Share: every value matching the wildcard shares one counter.
	Share bool
	// RequestsPerUnit and Unit as the document says them (Unit is UnitNone
	// when the window extension set the period).
	RequestsPerUnit uint32
	Unit            Unit
	// Algorithm, Window and Burst are the limiter's limit (the key aside).
	Algorithm limit.Algorithm
	Window    time.Duration
	Burst     int64
}

// Entry is one entry of a request's descriptor.
type Entry struct{ Key, Value string }

// Match is the answer for one descriptor.
type Match struct {
	// Limit is nil when no limit applies.
	Limit *Limit
	// Shared holds, for entries matched by a share_threshold wildcard, the
	// pattern that names the counter in place of the value ("" elsewhere);
	// nil when no entry is shared.
	Shared []string
}

type wildcard struct {
	key   string
	parts []string // the value pattern split on '*'
	value string   // the pattern
	// joined is key_pattern, split on '*' in jparts: the reference matches
	// the request's key_value against it.
	joined string
	jparts []string
	n      *node
}

type exact struct{ key, value string }

type node struct {
	exact map[exact]*node
	any   map[string]*node // descriptors with a key and no value
	// joined holds the level's descriptors by the reference's string,
	// key_value (key alone without a value), for reference matching.
	joined map[string]*node
	wild   []wildcard
	limit  *Limit
	share  bool
	kv     exact // the descriptor's key and value
}

func newNode() *node {
	return &node{exact: map[exact]*node{}, any: map[string]*node{}, joined: map[string]*node{}}
}

// joinedKey is the reference's name of a descriptor, or of a request's
// entry: key_value, or the key alone without a value.
func joinedKey(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

func (n *node) leaf() bool { return len(n.exact) == 0 && len(n.any) == 0 && len(n.wild) == 0 }

// Config is a compiled set of documents, immutable, safe for concurrent use.
type Config struct {
	domains map[string]*node
	files   map[string]string // domain → file that declared it first
	strict  bool
}

// Option changes how documents compile.
type Option func(*Config)

// StrictMatch matches a request's entry by its key and its value apart.
// The reference (and Compile without this option) matches the joined
// string key_value, so the entry destination=cluster_mock matches the
// descriptor destination_cluster=mock, and the entry files_no=share/X1
// fits the wildcard files=no_share/*. With StrictMatch neither happens. A
// level where two descriptors join to one string (key a_b without a value
// and key a with value b) is refused either way, as the reference refuses
// it.
func StrictMatch() Option { return func(c *Config) { c.strict = true } }

// Compile builds a Config from documents. Two documents with one domain are
// an error unless merge (the reference's MERGE_DOMAIN_CONFIG), when their
// descriptors are merged and a descriptor declared twice is an error.
func Compile(docs []*Document, merge bool, opts ...Option) (*Config, error) {
	c := &Config{domains: map[string]*node{}, files: map[string]string{}}
	for _, o := range opts {
		o(c)
	}
	var errs []error
	for _, d := range docs {
		root, dup := c.domains[d.Domain]
		if dup && !merge {
			errs = append(errs, &Error{File: d.File, Field: "domain", Msg: fmt.Sprintf("domain %q already declared in %s (merging documents of one domain is off)", d.Domain, c.files[d.Domain])})
			continue
		}
		if !dup {
			root = newNode()
			c.domains[d.Domain] = root
			c.files[d.Domain] = d.File
		}
		errs = append(errs, c.load(root, d.File, d.Domain, d.Descriptors)...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Strict reports whether the configuration matches by key and value apart
// (StrictMatch).
func (c *Config) Strict() bool { return c.strict }

func (c *Config) load(into *node, file, parent string, ds []Descriptor) []error {
	var errs []error
	for _, d := range ds {
		path := pathOf(parent, d.Key, d.Value)
		n := newNode()
		n.share = d.ShareThreshold
		jk := joinedKey(d.Key, d.Value)
		n.kv = exact{d.Key, d.Value}
		if other, dup := into.joined[jk]; dup && other.kv != n.kv {
			errs = append(errs, &Error{File: file, Line: d.Line, Path: path, Msg: fmt.Sprintf("key %q value %q collides with key %q value %q: envoyproxy/ratelimit matches the joined string %q and refuses the second", d.Key, d.Value, other.kv.key, other.kv.value, jk)})
			continue
		}
		switch {
		case d.Value == "":
			if _, dup := into.any[d.Key]; dup {
				errs = append(errs, &Error{File: file, Line: d.Line, Path: path, Msg: "duplicate descriptor (declared in another document of the domain)"})
				continue
			}
			into.any[d.Key] = n
		case strings.Contains(d.Value, "*"):
			if slices.ContainsFunc(into.wild, func(w wildcard) bool { return w.key == d.Key && w.value == d.Value }) {
				errs = append(errs, &Error{File: file, Line: d.Line, Path: path, Msg: "duplicate descriptor (declared in another document of the domain)"})
				continue
			}
			into.wild = append(into.wild, wildcard{key: d.Key, parts: strings.Split(d.Value, "*"), value: d.Value, joined: jk, jparts: strings.Split(jk, "*"), n: n})
		default:
			k := exact{d.Key, d.Value}
			if _, dup := into.exact[k]; dup {
				errs = append(errs, &Error{File: file, Line: d.Line, Path: path, Msg: "duplicate descriptor (declared in another document of the domain)"})
				continue
			}
			into.exact[k] = n
		}
		into.joined[jk] = n
		if r := d.RateLimit; r != nil {
			l := &Limit{Path: path, Name: r.Name, Replaces: r.Replaces, Unlimited: r.Unlimited, Shadow: d.ShadowMode, Share: d.ShareThreshold, Quota: d.QuotaMode, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit, Window: r.Window, Burst: r.Burst, Algorithm: limit.FixedWindow}
			if r.Algorithm != "" {
				l.Algorithm, _ = limit.Parse(r.Algorithm) // validated by Parse
			}
			if l.Window == 0 {
				l.Window = r.Unit.Duration()
			}
			n.limit = l
		}
		errs = append(errs, c.load(n, file, path, d.Descriptors)...)
	}
	return errs
}

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Limits lists every limit of the configuration, sorted by path.
func (c *Config) Limits() []Limit {
	var out []Limit
	var walk func(n *node)
	walk = func(n *node) {
		if n.limit != nil {
			out = append(out, *n.limit)
		}
		for _, m := range n.exact {
			walk(m)
		}
		for _, m := range n.any {
			walk(m)
		}
		for _, w := range n.wild {
			walk(w.n)
		}
	}
	for _, n := range c.domains {
		walk(n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool {
	_, ok := c.domains[domain]
	return ok
}

// Lookup finds the limit for one descriptor of a request, as the
// reference's GetLimit does: entries are walked level by level; at each
// level an entry matches the descriptor named by its key_value (the joined
// string, see StrictMatch), else the first wildcard, in document order,
// that key_value fits, else the descriptor named by its key alone. The
// walk stops where the tree ends, and a limit applies only if the walk
// reaches the last entry on a descriptor that has one.
func (c *Config) Lookup(domain string, entries []Entry) Match {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return Match{}
	}
	var m Match
	for i, e := range entries {
		next, shared := c.step(n, e)
		if next == nil {
			return Match{}
		}
		if shared != "" && next.share {
			if m.Shared == nil {
				m.Shared = make([]string, len(entries))
			}
			m.Shared[i] = shared
		}
		if i == len(entries)-1 {
			m.Limit = next.limit
			if m.Limit == nil {
				m.Shared = nil
			}
			return m
		}
		if next.leaf() {
			return Match{}
		}
		n = next
	}
	return Match{}
}

// step is the descriptor of level n that entry e matches (nil: none), and
// the wildcard pattern that matched it ("" for none).
func (c *Config) step(n *node, e Entry) (*node, string) {
	if c.strict {
		if next := n.exact[exact{e.Key, e.Value}]; next != nil {
			return next, ""
		}
		for _, w := range n.wild {
			if w.key == e.Key && wildcardMatch(w.parts, e.Value) {
				return w.n, w.value
			}
		}
		return n.any[e.Key], ""
	}
	// The reference joins with "_" even when the value is empty.
	jk := e.Key + "_" + e.Value
	if next := n.joined[jk]; next != nil {
		return next, ""
	}
	for _, w := range n.wild {
		if wildcardMatch(w.jparts, jk) {
			return w.n, strings.TrimPrefix(w.joined, e.Key+"_")
		}
	}
	return n.joined[e.Key], ""
}

// wildcardMatch reports whether value fits a pattern split on '*' (each '*'
// matches any run of characters, the empty one included).
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
