package rlsdiff

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A Case is one ShouldRateLimit call, sent to both services in turn.
type Case struct {
	Name string
	Req  *pb.RateLimitRequest
	// Look is set when a descriptor carries its own hits_addend of 0.
	Look bool
	// Window is the shortest window a descriptor of the call may count
	// in: a second, or a minute for any longer unit (their windows all
	// end on a minute's end); 0 when none may. The call is sent early
	// enough in that window that both services count it in the same one.
	Window time.Duration
}

// node is a descriptor of a document, read loosely: the harness must
// build calls even from documents one of the services refuses.
type node struct {
	Key         string  `yaml:"key"`
	Value       string  `yaml:"value"`
	RateLimit   *limit  `yaml:"rate_limit"`
	Descriptors []*node `yaml:"descriptors"`
}

type limit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unlimited       bool   `yaml:"unlimited"`
}

type document struct {
	Domain      string  `yaml:"domain"`
	Descriptors []*node `yaml:"descriptors"`
}

// readDocuments reads what it can of each file; a file that is not a
// document adds nothing (the services' verdict on it is compared apart).
func readDocuments(files []string) []document {
	var docs []document
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var d document
		if yaml.Unmarshal(b, &d) != nil {
			continue
		}
		docs = append(docs, d)
	}
	return docs
}

// path is a walk from a domain's top level down to one descriptor.
type path []*node

func walk(prefix path, ns []*node, visit func(path)) {
	for _, n := range ns {
		if n == nil {
			continue
		}
		p := append(append(path{}, prefix...), n)
		visit(p)
		walk(p, n.Descriptors, visit)
	}
}

// entries turns a path into a descriptor's entries: a node's value, a
// wildcard's prefix followed by suffix, or, for a key without a value,
// anyValue.
func (p path) entries(suffix, anyValue string) []*rlv3.RateLimitDescriptor_Entry {
	es := make([]*rlv3.RateLimitDescriptor_Entry, len(p))
	for i, n := range p {
		v := n.Value
		switch {
		case strings.HasSuffix(v, "*"):
			v = strings.TrimSuffix(v, "*") + suffix
		case v == "":
			v = anyValue
		}
		es[i] = &rlv3.RateLimitDescriptor_Entry{Key: n.Key, Value: v}
	}
	return es
}

func (p path) String() string {
	parts := make([]string, len(p))
	for i, n := range p {
		parts[i] = n.Key
		if n.Value != "" {
			parts[i] += "=" + n.Value
		}
	}
	return strings.Join(parts, ",")
}

// window is the shortest window any descriptor of the path may count in
// (Case.Window; the walk may end on a sibling of another unit).
func (p path) window() time.Duration {
	var w time.Duration
	for _, n := range p {
		if n.RateLimit != nil {
			w = shorter(w, unitWindow(n.RateLimit.Unit))
		}
	}
	return w
}

// unitWindow is Case.Window for a limit's unit.
func unitWindow(unit string) time.Duration {
	if strings.EqualFold(unit, "second") {
		return time.Second
	}
	return time.Minute
}

// shorter is the shorter of two windows, 0 standing for none.
func shorter(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// rate is what the path's last descriptor allows per unit, 3 when it
// sets no limit (a call then crosses whatever applies instead).
func (p path) rate() uint32 {
	if l := p[len(p)-1].RateLimit; l != nil && l.RequestsPerUnit > 0 && l.RequestsPerUnit < 1_000_000 {
		return l.RequestsPerUnit
	}
	return 3
}

// Cases builds the calls for one configuration set: for every descriptor
// path, the path itself (each wildcard filled twice), the path with its
// last value changed and with one entry more; each walked through hits
// that cross the limit (request hits_addend 0, 1, 2 and the rest of the
// limit), a descriptor's own hits_addend (0: a look; n), every path of a
// domain in one call, and calls no configuration can answer.
func Cases(files []string) []Case {
	var cs []Case
	add := func(name string, window time.Duration, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) {
		c := Case{Name: name, Window: window, Req: &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}}
		for _, d := range ds {
			if d.HitsAddend != nil && d.HitsAddend.Value == 0 {
				c.Look = true
			}
		}
		cs = append(cs, c)
	}
	desc := func(es []*rlv3.RateLimitDescriptor_Entry) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: es}
	}
	own := func(es []*rlv3.RateLimitDescriptor_Entry, n uint64) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: es, HitsAddend: wrapperspb.UInt64(n)}
	}
	var domains []string
	seen := map[string]bool{}
	for _, d := range readDocuments(files) {
		if !seen[d.Domain] {
			seen[d.Domain] = true
			domains = append(domains, d.Domain)
		}
		var all []*rlv3.RateLimitDescriptor
		var shortest time.Duration
		walk(nil, d.Descriptors, func(p path) {
			r := p.rate()
			w := p.window()
			shortest = shorter(shortest, w)
			variants := []struct {
				name string
				es   []*rlv3.RateLimitDescriptor_Entry
			}{
				{"match", p.entries("x1", "any1")},
				{"wildcard-other", p.entries("x2", "any2")},
				{"last-value-other", append(p[:len(p)-1].entries("x1", "any1"), &rlv3.RateLimitDescriptor_Entry{Key: p[len(p)-1].Key, Value: "zz-other"})},
				{"one-more-entry", append(p.entries("x1", "any1"), &rlv3.RateLimitDescriptor_Entry{Key: "zz-extra", Value: "e"})},
			}
			all = append(all, desc(variants[0].es))
			for _, v := range variants {
				base := fmt.Sprintf("%s/%s/%s", d.Domain, p, v.name)
				// Request-level hits: 0 means 1, then the rest of the limit,
				// then past it; a look after each step.
				for i, h := range []uint32{0, 1, 2, r} {
					add(fmt.Sprintf("%s/hits#%d=%d", base, i, h), w, d.Domain, h, desc(v.es))
					add(fmt.Sprintf("%s/look#%d", base, i), w, d.Domain, 0, own(v.es, 0))
				}
				add(base+"/own-hits=2", w, d.Domain, 1, own(v.es, 2))
				add(base+"/after", w, d.Domain, 1, desc(v.es))
			}
		})
		if len(all) > 0 {
			for i := 0; i < 3; i++ {
				add(fmt.Sprintf("%s/all-paths#%d", d.Domain, i), shortest, d.Domain, 1, all...)
			}
		}
	}
	sort.Strings(domains)
	e := []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}
	add("unknown-domain", 0, "zz-unknown-domain", 1, desc(e))
	add("empty-domain", 0, "", 1, desc(e))
	for _, d := range domains {
		add(d+"/no-descriptor", 0, d, 1)
		add(d+"/empty-entries", 0, d, 1, desc(nil))
		add(d+"/empty-key", 0, d, 1, desc([]*rlv3.RateLimitDescriptor_Entry{{Key: "", Value: "v"}}))
	}
	return cs
}

// yamlFiles lists the documents of a directory as both services read it.
func yamlFiles(dir string) ([]string, error) {
	var fs []string
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			fs = append(fs, p)
		}
		return nil
	})
	sort.Strings(fs)
	return fs, err
}
