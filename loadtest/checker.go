package edgeguard

import (
	"encoding/json"
	"fmt"
	"net/textproto"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grafana/sobek"

	"github.com/edgeguard/edgeguard/loadtest/internal/accuracy"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// checkerOptions configure checker(opts).
type checkerOptions struct {
	// RulesFile is the rules document the edges run (the stack's
	// rules_file), relative to the working directory; or Rules, its text.
	RulesFile string `json:"rulesFile"`
	Rules     string `json:"rules"`
	// APIKeyHeader is the header the population sends its API keys in; a
	// rule keyed on ip and/or this header is keyed on the client alone.
	APIKeyHeader string `json:"apiKeyHeader"`
	// Settle is how long after sending a request its response is surely
	// recorded: at least the requests' timeout. Findings are judged that
	// much later than they happen (and all at finish()).
	Settle string `json:"settle"`
	// FixedWindow turns the fixed_window checks on; they need the load
	// generator and Redis to share a clock (a loopback stack).
	FixedWindow *bool `json:"fixedWindow"`
	// Findings caps the findings of each kind kept for the summary.
	Findings int `json:"findings"`
}

// sharedChecker is one checker for every VU of a run.
type sharedChecker struct {
	c         *accuracy.Checker
	rules     map[string]rules.Rule
	settle    time.Duration
	keep      int
	lastFlush atomic.Int64 // unix µs

	mu       sync.Mutex
	findings []accuracy.Finding
	kept     map[string]int               // findings kept per kind
	combos   map[string]map[string]string // tag sets seen, for the zero samples at finish
	finished bool
}

// Checker is one VU's handle on the shared checker.
type Checker struct {
	mi *ModuleInstance
	sc *sharedChecker
}

// Checker is checker(opts) for scripts. Every VU asking for the same rules
// shares one checker.
func (mi *ModuleInstance) Checker(v sobek.Value) (*Checker, error) {
	o := checkerOptions{APIKeyHeader: "X-API-Key", Settle: "10s", Findings: 50}
	if v == nil || sobek.IsUndefined(v) || sobek.IsNull(v) {
		return nil, fmt.Errorf("checker: want options with rulesFile or rules")
	}
	b, err := json.Marshal(v.Export())
	if err != nil {
		return nil, fmt.Errorf("checker options: %w", err)
	}
	if err := decodeStrict(b, &o); err != nil {
		return nil, fmt.Errorf("checker options: %w", err)
	}
	key := string(b)
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	sc := mi.root.checkers[key]
	if sc == nil {
		if sc, err = newSharedChecker(o); err != nil {
			return nil, err
		}
		mi.root.checkers[key] = sc
	}
	return &Checker{mi: mi, sc: sc}, nil
}

func newSharedChecker(o checkerOptions) (*sharedChecker, error) {
	text := []byte(o.Rules)
	switch {
	case o.RulesFile != "" && o.Rules != "":
		return nil, fmt.Errorf("checker: give rulesFile or rules, not both")
	case o.RulesFile != "":
		var err error
		if text, err = os.ReadFile(o.RulesFile); err != nil {
			return nil, fmt.Errorf("checker: reading rules: %w", err)
		}
	case o.Rules == "":
		return nil, fmt.Errorf("checker: want rulesFile or rules")
	}
	doc, err := rules.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("checker: %w", err)
	}
	settle, err := time.ParseDuration(o.Settle)
	if err != nil || settle <= 0 {
		return nil, fmt.Errorf("checker: settle %q: want a positive duration", o.Settle)
	}
	if o.Findings < 0 {
		return nil, fmt.Errorf("checker: findings %d: want >= 0", o.Findings)
	}
	fixed := o.FixedWindow == nil || *o.FixedWindow
	pols, byID := Policies(doc, o.APIKeyHeader, fixed)
	return &sharedChecker{c: accuracy.New(pols), rules: byID, settle: settle, keep: o.Findings,
		combos: map[string]map[string]string{}, kept: map[string]int{}}, nil
}

// Policies turns a rules document into the checker's policies.
func Policies(doc *rules.Document, apiKeyHeader string, fixedWindow bool) ([]accuracy.Policy, map[string]rules.Rule) {
	apiKey := "header:" + textproto.CanonicalMIMEHeaderKey(apiKeyHeader)
	var out []accuracy.Policy
	byID := map[string]rules.Rule{}
	for _, r := range doc.Rules {
		if r.Disabled {
			continue
		}
		byID[r.ID] = r
		clientKeyed := len(r.Key) > 0
		for _, k := range r.Key {
			if k != "ip" && k != apiKey {
				clientKeyed = false
			}
		}
		algo := string(r.Algorithm)
		if algo == accuracy.FixedWindow && !fixedWindow {
			algo += " (unchecked)"
		}
		cost := max(r.Cost, 1)
		out = append(out, accuracy.Policy{
			Name: r.ID, Algorithm: algo, Quota: r.Limit / cost, Window: r.Window.D(),
			PerPoP: r.Scope == rules.ScopePoP, ClientKeyed: clientKeyed,
			MinInterval: r.MinInterval.D(), Shadow: r.Shadow,
			Global: r.Scope == rules.ScopeGlobal,
		})
		if r.Accuracy == rules.AccuracyLeased {
			out[len(out)-1].Tolerance = r.Tolerance
		}
	}
	return out, byID
}

type recordInfo struct {
	Sent     float64           `json:"sent"`
	Received float64           `json:"received"`
	Region   string            `json:"region"`
	PoP      string            `json:"pop"`
	Tags     map[string]string `json:"tags"`
}

// Record is checker.record(clientId, res, {sent, received, region, pop,
// tags}): sent and received are now() readings around the request; tags
// travel to the findings this response causes.
func (c *Checker) Record(client int, res sobek.Value, info sobek.Value) error {
	var in recordInfo
	if info == nil || sobek.IsUndefined(info) {
		return fmt.Errorf("record: want {sent, received, region}")
	}
	b, err := json.Marshal(info.Export())
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if err := decodeStrict(b, &in); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if in.Sent <= 0 || in.Received < in.Sent || in.Region == "" {
		return fmt.Errorf("record: want sent > 0, received >= sent and a region (got %+v)", in)
	}
	r, err := c.mi.readResponse(res)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	f := c.mi.parse(r)
	ev := accuracy.Event{Client: client, Region: in.Region, PoP: in.PoP, Sent: fromMillis(in.Sent),
		Recv: fromMillis(in.Received), Status: r.status, Tags: in.Tags}
	for _, p := range f.Policies {
		ev.Applied = append(ev.Applied, p.Name)
		c.checkPolicy(p.Name, p.Quota, p.Window, in)
	}
	ev.RetryAfter, ev.HasRetry = f.RetryAfter, f.HasRetryAfter
	if r.status == 429 && r.hasBody {
		var body struct {
			Violated []string `json:"violated-policies"`
		}
		if json.Unmarshal(r.body, &body) == nil && len(body.Violated) > 0 {
			ev.Violated, ev.ViolatedRead = body.Violated, true
		}
	}
	if r.status == 429 && !ev.ViolatedRead {
		_ = c.mi.push(c.mi.metrics.malformed, 1, map[string]string{"field": "violated-policies"})
	}
	tags := map[string]string{"region": in.Region}
	for k, v := range in.Tags {
		tags[k] = v
	}
	c.sc.noteCombo(tags)
	if c.sc.c.Record(ev) {
		_ = c.mi.push(c.mi.metrics.late, 1, tags)
	}
	_ = c.mi.push(c.mi.metrics.checked, 1, tags)
	// Judge what has settled, at most twice a second for the whole run.
	now := time.Now()
	last := c.sc.lastFlush.Load()
	if now.UnixMicro()-last > 500_000 && c.sc.lastFlush.CompareAndSwap(last, now.UnixMicro()) {
		c.emit(c.sc.c.Flush(now.Add(-c.sc.settle)))
	}
	return nil
}

// checkPolicy counts a response whose RateLimit-Policy disagrees with the
// rules document the checker read: the edges run other rules.
func (c *Checker) checkPolicy(name string, q, w int64, in recordInfo) {
	r, ok := c.sc.rules[name]
	want := ok
	if ok {
		// What q and w mean comes from the algorithm registry, as on the edge.
		alg, _ := limit.Parse(string(r.Algorithm))
		l := limit.Limit{Algorithm: alg, Limit: r.Limit, Burst: r.Burst}
		want = alg.Valid() && q == l.Capacity() && (alg.Spec().Held || w == int64(r.Window.D()/time.Second))
	}
	if !want {
		_ = c.mi.push(c.mi.metrics.mismatch, 1, map[string]string{"region": in.Region, "policy": name})
	}
}

func (c *Checker) emit(fs []accuracy.Finding) {
	for _, f := range fs {
		tags := map[string]string{"region": f.Region, "policy": f.Policy}
		if f.PoP != "" {
			tags["pop"] = f.PoP
		}
		for k, v := range f.Tags {
			tags[k] = v
		}
		r, ok := c.sc.rules[f.Policy]
		leased := ok && (r.Accuracy == rules.AccuracyLeased || r.Scope == rules.ScopeGlobal)
		m := c.mi.metrics.overAdmission
		switch {
		case f.Kind == accuracy.FalseDenial && leased:
			m = c.mi.metrics.leasedDenial
		case f.Kind == accuracy.FalseDenial:
			m = c.mi.metrics.falseDenial
		case f.Kind == accuracy.BrokenPromise && leased:
			m = c.mi.metrics.leasedPromise
		case f.Kind == accuracy.BrokenPromise:
			m = c.mi.metrics.brokenPromise
		}
		_ = c.mi.push(m, 1, tags)
	}
	c.sc.mu.Lock()
	for _, f := range fs {
		if c.sc.kept[f.Kind] < c.sc.keep {
			c.sc.kept[f.Kind]++
			c.sc.findings = append(c.sc.findings, f)
		}
	}
	c.sc.mu.Unlock()
}

func (sc *sharedChecker) noteCombo(tags map[string]string) {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	id := ""
	for _, k := range keys {
		id += strconv.Quote(k) + "=" + strconv.Quote(tags[k]) + ";"
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if _, ok := sc.combos[id]; !ok && len(sc.combos) < 1000 {
		sc.combos[id] = tags
	}
}

// Finish is checker.finish(), for teardown(): it judges everything still
// pending, emits a zero sample for every metric and tag set seen (so each
// threshold has data even when nothing was found) and returns the summary.
func (c *Checker) Finish() (sobek.Value, error) {
	c.emit(c.sc.c.Flush(time.Now().Add(24 * time.Hour * 365)))
	c.sc.mu.Lock()
	combos := make([]map[string]string, 0, len(c.sc.combos))
	for _, t := range c.sc.combos {
		combos = append(combos, t)
	}
	c.sc.finished = true
	c.sc.mu.Unlock()
	for _, t := range combos {
		if err := c.mi.push(c.mi.metrics.overAdmission, 0, t); err != nil {
			return nil, fmt.Errorf("finish: %w", err)
		}
		_ = c.mi.push(c.mi.metrics.falseDenial, 0, t)
		_ = c.mi.push(c.mi.metrics.leasedDenial, 0, t)
		_ = c.mi.push(c.mi.metrics.brokenPromise, 0, t)
		_ = c.mi.push(c.mi.metrics.leasedPromise, 0, t)
	}
	return c.Summary()
}

type checkerSummary struct {
	Stats    accuracy.Stats     `json:"stats"`
	Findings []accuracy.Finding `json:"findings"`
	Policies []policySummary    `json:"policies"`
	Finished bool               `json:"finished"`
}

type policySummary struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Quota     int64  `json:"q"`
	// Bound is the most admissions one window may hold: q, or a leased or
	// global rule's ⌊q·(1+tolerance)⌋.
	Bound  int64    `json:"bound"`
	Window string   `json:"window"`
	Scope  string   `json:"scope"`
	Checks []string `json:"checks"`
}

// Summary is checker.summary(): stats, the first findings and what was
// checked for each policy (for handleSummary).
func (c *Checker) Summary() (sobek.Value, error) {
	s := checkerSummary{Stats: c.sc.c.Stats()}
	c.sc.mu.Lock()
	s.Findings = append([]accuracy.Finding{}, c.sc.findings...)
	s.Finished = c.sc.finished
	c.sc.mu.Unlock()
	for _, p := range c.sc.c.Policies() {
		ps := policySummary{Name: p.Name, Algorithm: p.Algorithm, Quota: p.Quota, Bound: p.Bound(), Window: p.Window.String(), Scope: "region", Checks: []string{}}
		switch {
		case p.PerPoP:
			ps.Scope = "pop"
		case p.Global:
			ps.Scope = "all regions"
		}
		ps.Checks = append(ps.Checks, p.Checks()...)
		s.Policies = append(s.Policies, ps)
	}
	return toJS(c.mi.vu.Runtime(), s)
}
