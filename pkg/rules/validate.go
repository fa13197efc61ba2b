package rules

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// maxIDLen bounds rule ids. A rule's quota fields are bounded by package
// limit, the limiter's own definition of a limit it can decide.
const maxIDLen = 64

// Validate checks the document and reports every problem at once
// (errors.Join of *FieldError). It also normalizes the document in place, so
// that a validated document has one spelling per meaning: methods upper-case,
// hosts lower-case, path prefixes passed through NormalizePath, header names
// canonical, empty scope set to region, and match lists sorted. Validating an
// already valid document again changes nothing.
func (d *Document) Validate() error { return d.validate(false) }

// validate is Validate, in one piece per CPU for a large document when
// parallel is set: only for documents whose rules share no lists (a copy
// made by clone, a document just decoded), since validating normalizes
// the lists in place.
func (d *Document) validate(parallel bool) error {
	if d == nil {
		return errors.New("rules: nil document")
	}
	errs := d.checkLimits()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if d.Version != SchemaVersion {
		errs = append(errs, &FieldError{Index: -1, Field: versionField(), Msg: fmt.Sprintf("unsupported %d (want %d)", d.Version, SchemaVersion)})
	}
	if d.Behaviour != nil {
		for _, p := range d.Behaviour.Validate() {
			errs = append(errs, &FieldError{Index: -1, Field: p.Field, Msg: p.Msg})
		}
	}
	// Repeated ids first (validating a rule does not change its id), so
	// the rules can be validated in pieces and every problem still comes
	// in rule order.
	seen := make(map[string]int, len(d.Rules))
	var dups map[int]int // rule -> the earlier rule with its id
	for i := range d.Rules {
		id := d.Rules[i].ID
		if id == "" {
			continue
		}
		if j, dup := seen[id]; dup {
			if dups == nil {
				dups = map[int]int{}
			}
			dups[i] = j
			continue
		}
		seen[id] = i
	}
	// Each piece lists its first MaxProblems problems, and counts the
	// others: the first MaxProblems of the document are among them.
	validate := func(from, to int) []error {
		var errs []error
		q := &quota{left: MaxProblems}
		for i := from; i < to; i++ {
			r := &d.Rules[i]
			errs = append(errs, r.validate(i, q)...)
			if j, dup := dups[i]; dup && q.take() {
				errs = append(errs, &FieldError{RuleID: r.ID, Index: i, Field: r.name(&r.ID), Msg: fmt.Sprintf("duplicate (also %s[%d])", rulesField(), j)})
			}
		}
		if q.dropped > 0 {
			errs = append(errs, moreProblems(q.dropped))
		}
		return errs
	}
	n := runtime.GOMAXPROCS(0)
	if !parallel || len(d.Rules) < parallelValidate || n < 2 {
		return errors.Join(append(errs, validate(0, len(d.Rules))...)...)
	}
	pieces := make([][]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { pieces[k] = validate(k*len(d.Rules)/n, (k+1)*len(d.Rules)/n) })
	}
	wg.Wait()
	for _, p := range pieces {
		errs = append(errs, p...)
	}
	return errors.Join(errs...)
}

// parallelValidate is the rule count from which Validate checks the rules
// in one piece per CPU. A variable for tests.
var parallelValidate = 4096

func (r *Rule) validate(index int, q *quota) []error {
	p := &problems{rule: r, id: r.ID, index: index, quota: q}
	switch {
	case r.ID == "":
		p.addf(r.name(&r.ID), "required")
	case !validID(r.ID):
		p.addf(r.name(&r.ID), "invalid %q: want 1-%d characters from A-Z a-z 0-9 _ . - (ids become part of Redis keys)", r.ID, maxIDLen)
	}
	if r.Disabled {
		// A disabled rule only names what it switches off.
		return p.errs
	}

	r.validateLimit(p)

	switch r.Scope {
	case "":
		r.Scope = ScopeRegion
	case ScopeRegion, ScopePoP:
	case ScopeGlobal:
		r.validateGlobal(p)
	default:
		p.addf(r.name(&r.Scope), "unknown %q (want %s, %s or %s)", r.Scope, ScopeRegion, ScopePoP, ScopeGlobal)
	}

	r.validateAccuracy(p)
	r.validateKey(p)
	r.validateMatch(p)
	r.validateEscapes(p)
	return p.errs
}

// limit is the rule's quota as the limiter sees it (no key: keys are made
// per request). An unknown algorithm is the zero Algorithm.
func (r *Rule) limit() limit.Limit {
	alg, _ := limit.Parse(string(r.Algorithm))
	return limit.Limit{Algorithm: alg, Limit: r.Limit, Window: r.Window.D(), Burst: r.Burst, MinInterval: r.MinInterval.D()}
}

// validateLimit reports the quota fields' problems as the limiter defines
// them (limit.Limit.Problems), by field: a rule that validates is one the
// limiter can decide.
func (r *Rule) validateLimit(p *problems) {
	switch _, err := limit.Parse(string(r.Algorithm)); {
	case r.Algorithm == "":
		p.addf(r.name(&r.Algorithm), "required (one of %s)", strings.Join(limit.Names(), ", "))
	case err != nil:
		p.addf(r.name(&r.Algorithm), "unknown %q (want one of %s)", r.Algorithm, strings.Join(limit.Names(), ", "))
	}
	l := r.limit()
	quotaOK := true
	for _, pr := range l.Problems() {
		f := r.limitField(pr.Field)
		if f == &r.Algorithm {
			continue // reported above, with the name as written
		}
		p.addf(r.name(f), "%s", pr.Msg)
		quotaOK = quotaOK && f != &r.Limit && f != &r.Burst
	}
	if pr := l.CostProblem(r.Cost); pr != nil && (r.Cost < 1 || quotaOK && l.Algorithm.Valid()) {
		p.addf(r.name(r.limitField(pr.Field)), "%s", pr.Msg)
	}
}

// limitField is the field of r that a limit.Problem's Field names: package
// limit speaks of a limit's parts by the words of the first rule schema,
// and this is the one place that maps its words onto the field table.
func (r *Rule) limitField(word string) any {
	switch word {
	case "algorithm":
		return &r.Algorithm
	case "limit":
		return &r.Limit
	case "window":
		return &r.Window
	case "burst":
		return &r.Burst
	case "min_interval":
		return &r.MinInterval
	case "cost":
		return &r.Cost
	}
	panic("rules: package limit names an unknown field " + word)
}

// validateAccuracy normalizes exact to "" (the default) and gives a leased
// rule its default tolerance.
func (r *Rule) validateAccuracy(p *problems) {
	switch r.Accuracy {
	case "", AccuracyExact:
		r.Accuracy = ""
		if r.Tolerance != 0 {
			p.addf(r.name(&r.Tolerance), "only valid with %s: %s", r.name(&r.Accuracy), AccuracyLeased)
		}
		return
	case AccuracyLeased:
	default:
		p.addf(r.name(&r.Accuracy), "unknown %q (want %s or %s)", r.Accuracy, AccuracyExact, AccuracyLeased)
		return
	}
	if r.Tolerance == 0 {
		r.Tolerance = DefaultTolerance
	}
	if !(r.Tolerance >= limit.MinTolerance && r.Tolerance <= limit.MaxTolerance) {
		p.addf(r.name(&r.Tolerance), "must be in [%g, %g] (got %g)", limit.MinTolerance, limit.MaxTolerance, r.Tolerance)
	}
	if sp := r.limit().Algorithm.Spec(); sp != nil && !sp.Leasable {
		p.addf(r.name(&r.Accuracy), "%s cannot be leased (want one of %s)", sp.Name, strings.Join(limit.LeasableNames(), ", "))
	}
}

// validateGlobal makes a global rule leased (its default tolerance follows)
// and refuses what cannot hold a global rule's bound: an exact global rule
// would put the link between regions on every request, only fixed_window is
// proved across regions, and a rule counted after the response counts in
// the edge's own region only.
func (r *Rule) validateGlobal(p *problems) {
	switch r.Accuracy {
	case "":
		r.Accuracy = AccuracyLeased
	case AccuracyExact:
		p.addf(r.name(&r.Accuracy), "%s: %s is leased from the key's home region; %s: %s would wait on another region for every request", r.name(&r.Scope), ScopeGlobal, r.name(&r.Accuracy), AccuracyExact)
	}
	if alg, err := limit.Parse(string(r.Algorithm)); err == nil && alg != limit.FixedWindow {
		p.addf(r.name(&r.Scope), "%s is only for %s rules (got %s)", ScopeGlobal, limit.FixedWindow, alg)
	}
	if r.AfterResponse() {
		p.addf(r.name(&r.Scope), "%s cannot count after the response (%s, %s count in the edge's region only)", ScopeGlobal, r.name(&r.CountIf), r.name(&r.CostHeader))
	}
}

func (r *Rule) validateKey(p *problems) {
	if len(r.Key) == 0 {
		p.addf(r.name(&r.Key), "required: at least one of %s", descriptorList)
		return
	}
	var seen []string // a rule has a few descriptors: a scan beats a map
	for i, raw := range r.Key {
		d, err := parseDescriptor(raw)
		if err != nil {
			p.addf(fmt.Sprintf("%s[%d]", r.name(&r.Key), i), "%v", err)
			seen = append(seen, "")
			continue
		}
		canon := d.String()
		if j := slices.Index(seen, canon); j >= 0 {
			p.addf(fmt.Sprintf("%s[%d]", r.name(&r.Key), i), "duplicate %q (same as %s[%d])", canon, r.name(&r.Key), j)
			seen = append(seen, "")
			continue
		}
		seen = append(seen, canon)
		r.Key[i] = canon
	}
}

func (r *Rule) validateMatch(p *problems) {
	m := &r.Match
	normalizeList(p, &m.Hosts, normalizeHostPattern)
	normalizeList(p, &m.PathPrefix, normalizePrefix)
	normalizeList(p, &m.Methods, normalizeMethod)
	slices.Sort(m.Hosts)
	slices.Sort(m.PathPrefix)
	slices.Sort(m.Methods)
}

// normalizeList rewrites each entry of the list field (of p's rule) with
// norm and reports invalid entries and entries that collapse into the same
// normalized value.
func normalizeList(p *problems, field *[]string, norm func(string) (string, error)) {
	list := *field
	if len(list) == 0 {
		return
	}
	var seen map[string]int // only for lists long enough to need it
	for i, raw := range list {
		v, err := norm(raw)
		if err != nil {
			p.addf(fmt.Sprintf("%s[%d]", p.rule.name(field), i), "%v", err)
			continue
		}
		j := -1
		switch {
		case len(list) > 8:
			if seen == nil {
				seen = make(map[string]int, len(list))
			}
			if k, dup := seen[v]; dup {
				j = k
			} else {
				seen[v] = i
			}
		default:
			for k := range i {
				if list[k] == v && !failed(p, field, k) {
					j = k
					break
				}
			}
		}
		if j >= 0 {
			p.addf(fmt.Sprintf("%s[%d]", p.rule.name(field), i), "duplicate %q (same as [%d] after normalization)", v, j)
			continue
		}
		list[i] = v
	}
}

// failed reports whether entry k of field was reported invalid (its text
// left as written, so it must not count as a duplicate's original).
func failed(p *problems, field *[]string, k int) bool {
	if len(p.errs) == 0 {
		return false
	}
	name := fmt.Sprintf("%s[%d]", p.rule.name(field), k)
	for _, e := range p.errs {
		if fe, ok := e.(*FieldError); ok && fe.Field == name {
			return true
		}
	}
	return false
}

func normalizePrefix(raw string) (string, error) {
	if !strings.HasPrefix(raw, "/") {
		return "", fmt.Errorf("%q must start with /", raw)
	}
	if strings.ContainsAny(raw, "?#") {
		return "", fmt.Errorf("%q must not contain a query or fragment", raw)
	}
	n := NormalizePath(raw)
	// A prefix must be a fixed point, or validating twice would change it and
	// a request normalized once could never equal it.
	if NormalizePath(n) != n {
		return "", fmt.Errorf("%q is ambiguous: it normalizes to %q, which still contains percent-escapes", raw, n)
	}
	return n, nil
}

func normalizeMethod(raw string) (string, error) {
	if !isToken(raw) {
		return "", fmt.Errorf("%q is not a valid HTTP method token", raw)
	}
	return strings.ToUpper(raw), nil
}

func validID(id string) bool {
	if len(id) == 0 || len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// isToken reports whether s is an RFC 9110 token (method and header names).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
