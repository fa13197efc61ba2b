package rlsconfig

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Document is one configuration file: a domain and its descriptors.
type Document struct {
	// File names the document in errors (a path, or a Consul key).
	File        string
	Domain      string
	Descriptors []Descriptor
}

// Descriptor is one level of the descriptor tree.
type Descriptor struct {
	Key string
	// Value is "" for any value; with '*' it is a pattern ('*' matches any
	// run of characters, so "/api/*" is a prefix).
	Value       string
	RateLimit   *RateLimit
	Descriptors []Descriptor
	// ShadowMode counts but never denies.
	ShadowMode bool
	// QuotaMode: over the limit denies the request only when every
	// quota_mode descriptor of the request is over its limit.
	QuotaMode bool
	// ShareThreshold: every value matching the wildcard shares one counter.
	ShareThreshold bool
	// DetailedMetric and ValueToMetric are accepted and change nothing
	// (metrics keep bounded labels).
	DetailedMetric, ValueToMetric bool
	// Line is where the descriptor starts in the file.
	Line int
}

// RateLimit is a descriptor's limit.
type RateLimit struct {
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	// Name lets other limits replace this one (Replaces names them).
	Name     string
	Replaces []string
	// Extensions (edgeguard only): the algorithm (default fixed_window,
	// the reference's), a window instead of Unit, a bucket's burst.
	Algorithm string
	Window    time.Duration
	Burst     int64
	Line      int
}

// Unit is a rate limit unit of the reference, windows aligned to the Unix
// epoch as the reference aligns them.
type Unit uint8

// The units. A month is 30 days and a year 365, as in the reference.
const (
	UnitNone Unit = iota
	Second
	Minute
	Hour
	Day
	Week
	Month
	Year
)

var unitNames = [...]string{"", "second", "minute", "hour", "day", "week", "month", "year"}

var unitLengths = [...]time.Duration{0, time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}

// String is the unit's name in documents ("" for none).
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unit(" + strconv.Itoa(int(u)) + ")"
}

// Duration is the unit's length.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitLengths) {
		return unitLengths[u]
	}
	return 0
}

// ParseUnit reads a unit name, in any case as the reference does.
func ParseUnit(s string) (Unit, bool) {
	i := slices.Index(unitNames[1:], strings.ToLower(s))
	if i < 0 {
		return UnitNone, false
	}
	return Unit(i + 1), true
}

// Error is one problem with a document.
type Error struct {
	File string
	Line int // 1-based; 0 when unknown
	// Path names the descriptor as the reference does (domain.key_value.key);
	// empty for the document as a whole.
	Path string
	// Field is e.g. "rate_limit.unit"; empty for the descriptor as a whole.
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString("descriptor " + e.Path + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrInvalid matches every problem Parse and Compile report (errors.Is).
var ErrInvalid = errors.New("invalid rate limit service configuration")

// Unwrap makes every Error match ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

type parser struct {
	file string
	errs []error
}

func (p *parser) add(line int, path, field, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Path: path, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Parse reads one document strictly: unknown keys, wrong kinds and repeated
// keys are errors, and every problem is reported at once.
func Parse(file string, data []byte) (*Document, error) {
	p := &parser{file: file}
	doc := &Document{File: file}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			p.add(0, "", "", "empty document (want domain and descriptors)")
			return nil, errors.Join(p.errs...)
		}
		p.add(yamlErrLine(err), "", "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil, errors.Join(p.errs...)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add(extra.Line, "", "", "more than one YAML document (one domain per file)")
	}
	n := &root
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	// The domain first: descriptor paths start with it.
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "domain" && n.Content[i+1].Kind == yaml.ScalarNode {
				doc.Domain = n.Content[i+1].Value
			}
		}
	}
	p.mapping(n, "", "", func(k string, v *yaml.Node) {
		switch k {
		case "domain":
			doc.Domain = p.str(v, "", "domain")
		case "descriptors":
			doc.Descriptors = p.descriptors(v, doc.Domain, "descriptors")
		default:
			p.add(v.Line, "", k, "unknown key (want domain, descriptors)")
		}
	})
	if doc.Domain == "" {
		p.add(n.Line, "", "domain", "required and not empty")
	}
	p.checkLevel(doc.Descriptors, doc.Domain)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return doc, nil
}

// yamlErrLine digs the line out of a yaml.v3 syntax error ("yaml: line 3: ...").
func yamlErrLine(err error) int {
	s := err.Error()
	if i := strings.Index(s, "line "); i >= 0 {
		s = s[i+5:]
		if j := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); j > 0 {
			n, _ := strconv.Atoi(s[:j])
			return n
		}
	}
	return 0
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}

func (p *parser) mapping(n *yaml.Node, path, field string, each func(k string, v *yaml.Node)) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.MappingNode {
		p.add(n.Line, path, field, "want a mapping, got %s", kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add(k.Line, path, field, "a key must be a string, got %s", kindName(k))
			continue
		}
		if seen[k.Value] {
			p.add(k.Line, path, join(field, k.Value), "repeated key")
			continue
		}
		seen[k.Value] = true
		each(k.Value, v)
	}
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func (p *parser) scalar(n *yaml.Node, path, field, want string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n.Line, path, field, "want %s, got %s", want, kindName(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) str(n *yaml.Node, path, field string) string {
	if n.Kind == yaml.ScalarNode && n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" {
		p.add(n.Line, path, field, "want a string, got %s", kindName(n))
		return ""
	}
	s, _ := p.scalar(n, path, field, "a string")
	return s
}

func (p *parser) boolean(n *yaml.Node, path, field string) bool {
	s, ok := p.scalar(n, path, field, "true or false")
	if !ok {
		return false
	}
	var b bool
	if n.Tag != "!!bool" || n.Decode(&b) != nil {
		p.add(n.Line, path, field, "want true or false, got %q", s)
	}
	return b
}

func (p *parser) uint(n *yaml.Node, path, field string, maxV uint64) uint64 {
	s, ok := p.scalar(n, path, field, "a whole number")
	if !ok {
		return 0
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n.Tag != "!!int" || v > maxV {
		p.add(n.Line, path, field, "want a whole number from 0 to %d, got %q", maxV, s)
		return 0
	}
	return v
}

func (p *parser) descriptors(n *yaml.Node, parent, field string) []Descriptor {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, parent, field, "want a list of descriptors, got %s", kindName(n))
		return nil
	}
	out := make([]Descriptor, 0, len(n.Content))
	for i, c := range n.Content {
		out = append(out, p.descriptor(c, parent, fmt.Sprintf("%s[%d]", field, i)))
	}
	return out
}

// descriptor reads one descriptor. Its path is only known once key and
// value are read, so problems met before are reported under the list
// position (field) and those after under the path.
func (p *parser) descriptor(n *yaml.Node, parent, field string) Descriptor {
	d := Descriptor{Line: n.Line}
	var rl, children *yaml.Node
	p.mapping(n, parent, field, func(k string, v *yaml.Node) {
		switch k {
		case "key":
			d.Key = p.str(v, parent, field+".key")
		case "value":
			d.Value = p.str(v, parent, field+".value")
		case "rate_limit":
			rl = v
		case "descriptors":
			children = v
		case "shadow_mode":
			d.ShadowMode = p.boolean(v, parent, field+"."+k)
		case "quota_mode":
			d.QuotaMode = p.boolean(v, parent, field+"."+k)
		case "share_threshold":
			d.ShareThreshold = p.boolean(v, parent, field+"."+k)
		case "detailed_metric":
			d.DetailedMetric = p.boolean(v, parent, field+"."+k)
		case "value_to_metric":
			d.ValueToMetric = p.boolean(v, parent, field+"."+k)
		case "metadata":
			// Accepted and ignored: it only feeds response dynamic
			// metadata, which the reference sends only when asked
			// (RESPONSE_DYNAMIC_METADATA) and edgeguard does not send.
			if v.Kind != yaml.MappingNode {
				p.add(v.Line, parent, field+".metadata", "want a mapping, got %s", kindName(v))
			}
		default:
			p.add(v.Line, parent, field+"."+k, "unknown key (want key, value, rate_limit, descriptors, shadow_mode, quota_mode, share_threshold, detailed_metric, value_to_metric, metadata)")
		}
	})
	path := pathOf(parent, d.Key, d.Value)
	switch {
	case d.Key == "":
		p.add(n.Line, parent, field+".key", "required and not empty")
		path = parent + "." + field
	case strings.Contains(d.Key, "*"):
		p.add(n.Line, path, "key", "a wildcard '*' belongs in value, not in key")
	}
	if d.ShareThreshold && !strings.Contains(d.Value, "*") {
		p.add(n.Line, path, "share_threshold", "only with a wildcard value (containing '*')")
	}
	if rl != nil {
		d.RateLimit = p.rateLimit(rl, path)
	}
	if children != nil {
		d.Descriptors = p.descriptors(children, path, "descriptors")
	}
	return d
}

// pathOf names a descriptor as the reference does: parent.key_value.
func pathOf(parent, key, value string) string {
	s := key
	if value != "" {
		s += "_" + value
	}
	return parent + "." + s
}

func (p *parser) rateLimit(n *yaml.Node, path string) *RateLimit {
	r := &RateLimit{Line: n.Line}
	var unitLine int
	hasRPU := false
	p.mapping(n, path, "rate_limit", func(k string, v *yaml.Node) {
		f := "rate_limit." + k
		switch k {
		case "unit":
			unitLine = v.Line
			s := p.str(v, path, f)
			if u, ok := ParseUnit(s); ok {
				r.Unit = u
			} else if s != "" || v.Tag == "!!str" {
				p.add(v.Line, path, f, "invalid unit %q (want second, minute, hour, day, week, month or year)", s)
			}
		case "requests_per_unit":
			hasRPU = true
			r.RequestsPerUnit = uint32(p.uint(v, path, f, math.MaxUint32))
		case "unlimited":
			r.Unlimited = p.boolean(v, path, f)
		case "name":
			r.Name = p.str(v, path, f)
		case "replaces":
			r.Replaces = p.replaces(v, path)
		case "algorithm":
			r.Algorithm = p.str(v, path, f)
		case "window":
			s := p.str(v, path, f)
			w, err := time.ParseDuration(s)
			if err != nil {
				p.add(v.Line, path, f, "want a duration such as \"90s\" or \"15m\", got %q", s)
			}
			r.Window = w
		case "burst":
			r.Burst = int64(p.uint(v, path, f, limit.MaxLimit))
		default:
			p.add(v.Line, path, f, "unknown key (want unit, requests_per_unit, unlimited, name, replaces; extensions: algorithm, window, burst)")
		}
	})
	for _, name := range r.Replaces {
		if name == r.Name && name != "" {
			p.add(n.Line, path, "rate_limit.replaces", "must not name this limit itself (%q)", name)
		}
	}
	if r.Unlimited {
		if r.Unit != UnitNone {
			p.add(unitLine, path, "rate_limit.unit", "must not be set when unlimited")
		}
		for _, f := range []struct {
			set  bool
			name string
		}{{r.Algorithm != "", "algorithm"}, {r.Window != 0, "window"}, {r.Burst != 0, "burst"}} {
			if f.set {
				p.add(n.Line, path, "rate_limit."+f.name, "must not be set when unlimited")
			}
		}
		return r
	}
	switch {
	case r.Unit != UnitNone && r.Window != 0:
		p.add(n.Line, path, "rate_limit.window", "either unit or window (an extension), not both")
	case r.Unit == UnitNone && r.Window == 0:
		if unitLine == 0 {
			p.add(n.Line, path, "rate_limit.unit", "required (second, minute, hour, day, week, month or year), or unlimited: true")
		}
		return r
	}
	if !hasRPU {
		p.add(n.Line, path, "rate_limit.requests_per_unit", "required")
	}
	l, ok := p.limitOf(r, n.Line, path)
	if !ok {
		return r
	}
	for _, pr := range l.Problems() {
		field := map[string]string{"limit": "requests_per_unit", "window": "window", "burst": "burst", "algorithm": "algorithm", "min_interval": "window"}[pr.Field]
		if field == "window" && r.Window == 0 {
			field = "unit"
		}
		if field == "requests_per_unit" && l.Limit == 0 {
			continue // 0 denies every request, as in the reference
		}
		p.add(n.Line, path, "rate_limit."+field, "%s", pr.Msg)
	}
	return r
}

// limitOf is the limiter's view of a rate limit (without its key).
func (p *parser) limitOf(r *RateLimit, line int, path string) (limit.Limit, bool) {
	alg := limit.FixedWindow
	if r.Algorithm != "" {
		a, err := limit.Parse(r.Algorithm)
		if err != nil {
			p.add(line, path, "rate_limit.algorithm", "unknown %q (want one of %s)", r.Algorithm, strings.Join(limit.Names(), ", "))
			return limit.Limit{}, false
		}
		alg = a
	}
	w := r.Window
	if w == 0 {
		w = r.Unit.Duration()
	}
	return limit.Limit{Algorithm: alg, Limit: int64(r.RequestsPerUnit), Window: w, Burst: r.Burst}, true
}

func (p *parser) replaces(n *yaml.Node, path string) []string {
	if n.Kind != yaml.SequenceNode {
		p.add(n.Line, path, "rate_limit.replaces", "want a list of {name: ...}, got %s", kindName(n))
		return nil
	}
	var out []string
	for i, c := range n.Content {
		f := fmt.Sprintf("rate_limit.replaces[%d]", i)
		name, before := "", len(p.errs)
		p.mapping(c, path, f, func(k string, v *yaml.Node) {
			if k != "name" {
				p.add(v.Line, path, f+"."+k, "unknown key (want name)")
				return
			}
			name = p.str(v, path, f+".name")
		})
		if name == "" {
			if len(p.errs) == before {
				p.add(c.Line, path, f+".name", "required and not empty")
			}
			continue
		}
		out = append(out, name)
	}
	return out
}

// checkLevel reports descriptors of one level that the reference would
// refuse as duplicates (same key and value), recursively.
func (p *parser) checkLevel(ds []Descriptor, parent string) {
	seen := map[string]int{}
	for _, d := range ds {
		if d.Key == "" {
			continue
		}
		path := pathOf(parent, d.Key, d.Value)
		if line, dup := seen[path]; dup {
			p.add(d.Line, path, "", "duplicate descriptor (key and value already used on line %d)", line)
		} else {
			seen[path] = d.Line
		}
		p.checkLevel(d.Descriptors, path)
	}
}
