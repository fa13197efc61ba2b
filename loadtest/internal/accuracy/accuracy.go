// Package accuracy checks, from the client side, that an edge's rate limits
// held: it keeps each client's timeline per (policy, region[, PoP]) and
// reports
//
//   - over-admission: more than q admissions whose whole send→receive
//     intervals fit inside one window (sliding_log: any span shorter than
//     the window; fixed_window: one epoch-aligned window);
//   - false denials: a denial while the client's admissions that could
//     possibly count in that window were fewer than q;
//   - broken retry promises: a request sent at or after a 429's
//     Retry-After, with no possible admission of that client in between,
//     that is still denied by the same policy.
//
// Client clocks are jittery and a server decides at an unknown instant
// between send and receive, so every rule here is stated on intervals and
// errs towards silence: a finding is reported only when no placement of the
// server's decision instants inside the intervals could explain the
// responses. The fixed_window check assumes the client and Redis share a
// clock (a loopback stack); keep it off for remote stacks.
//
// Only exact algorithms keyed on the client alone are checked for over-
// admission and false denials; broken promises are checked for every
// client-keyed algorithm except concurrency.
//
// Leased rules (accuracy: leased) are held to their own bound: more than
// ⌊q·(1+tolerance)⌋ admissions in one window is over-admission, and a
// denial with fewer than q possible admissions is still a false denial (the
// design allows a few; Stats counts how many decisions were checked, so the
// rate can be stated). Global rules (scope: global) count one timeline per
// client across every region, since their quota is one for all regions.
package accuracy

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// Finding kinds (also the k6 metric suffixes).
const (
	OverAdmission = "over_admission"
	FalseDenial   = "false_denial"
	BrokenPromise = "broken_promise"
)

// Algorithms the checker knows (pkg/rules spelling).
const (
	SlidingLog    = "sliding_log"
	SlidingWindow = "sliding_window"
	TokenBucket   = "token_bucket"
	FixedWindow   = "fixed_window"
	Concurrency   = "concurrency"
)

// Policy is what the checker needs of one rule.
type Policy struct {
	Name      string
	Algorithm string
	// Quota is how many requests fit in one window: the rule's limit
	// divided by its cost.
	Quota  int64
	Window time.Duration
	// PerPoP is true for scope: pop (counted per PoP, not per region).
	PerPoP bool
	// ClientKeyed is true when the rule's key identifies the client alone
	// (its IP and/or its API key), so the client's own timeline is the
	// counter's whole history.
	ClientKeyed bool
	// MinInterval > 0 lets the server deny below quota; false denials are
	// then not checked.
	MinInterval time.Duration
	Shadow      bool
	// Tolerance is a leased rule's bound on over-admission as a share of
	// the quota (0 for exact rules).
	Tolerance float64
	// Global is true for scope: global (one count across every region).
	Global bool
}

// Bound is the most admissions one window may hold: the quota, or a leased
// rule's ⌊quota·(1+tolerance)⌋.
func (p *Policy) Bound() int64 {
	if p.Tolerance <= 0 {
		return p.Quota
	}
	return int64(math.Floor(float64(p.Quota) * (1 + p.Tolerance)))
}

func (p *Policy) checksCounts() bool {
	return p.ClientKeyed && !p.Shadow && p.Window > 0 && p.Quota > 0 &&
		(p.Algorithm == SlidingLog || p.Algorithm == FixedWindow)
}

// Checks names the checks that apply to the policy.
func (p *Policy) Checks() []string {
	var out []string
	if p.checksCounts() {
		out = append(out, OverAdmission)
		if p.MinInterval == 0 {
			out = append(out, FalseDenial)
		}
	}
	if p.checksPromises() {
		out = append(out, BrokenPromise)
	}
	return out
}

func (p *Policy) checksPromises() bool {
	return p.ClientKeyed && !p.Shadow && p.Algorithm != Concurrency
}

// Event is one response as the client saw it.
type Event struct {
	Client       int
	Region, PoP  string
	Sent, Recv   time.Time
	Status       int
	Applied      []string // RateLimit-Policy names (every applied non-shadow rule)
	Violated     []string // problem+json violated-policies of a 429
	ViolatedRead bool     // false when a 429's body could not be read
	RetryAfter   time.Duration
	HasRetry     bool
	// Tags travel with the event to the findings it causes (e.g. phase).
	Tags map[string]string
}

// Finding is one detected violation.
type Finding struct {
	Kind   string            `json:"kind"`
	Policy string            `json:"policy"`
	Region string            `json:"region"`
	PoP    string            `json:"pop,omitempty"`
	Client int               `json:"client"`
	Sent   time.Time         `json:"sent"`
	Recv   time.Time         `json:"received"`
	Tags   map[string]string `json:"tags,omitempty"`
	Detail string            `json:"detail"`
	// Evidence are the client's intervals the finding rests on: the
	// admissions counted (over-admission), the possible admissions
	// (false denial), the 429 whose promise was broken.
	Evidence []Interval `json:"evidence,omitempty"`
}

// Interval is one request as the client saw it.
type Interval struct {
	Sent time.Time `json:"sent"`
	Recv time.Time `json:"received"`
	Kind string    `json:"kind"`
}

// Stats count what was checked, so a run that checked nothing is visible.
type Stats struct {
	Events        int64            `json:"events"`
	Admissions    int64            `json:"admissions"`
	Denials       int64            `json:"denials"`
	Unknown       int64            `json:"unknown"`
	Unattributed  int64            `json:"unattributed_denials"`
	Late          int64            `json:"late_events"`
	UnknownPolicy int64            `json:"unknown_policies"`
	Findings      map[string]int64 `json:"findings"`
	CheckedCounts int64            `json:"checked_count_decisions"`
	// PromisesTested counts requests sent after a 429's Retry-After with
	// no admission in between: kept (admitted) plus broken (denied).
	PromisesTested int64 `json:"promises_tested"`
	// ByPolicy breaks the count checks down per policy (policies whose
	// counts are checked only).
	ByPolicy map[string]PolicyStats `json:"by_policy"`
}

// PolicyStats are one policy's count checks: what was judged and the most
// admissions seen inside one window, to set beside the policy's bound.
type PolicyStats struct {
	// Admissions and Denials judged against the count (over-admission,
	// false denial).
	Admissions int64 `json:"admissions_judged"`
	Denials    int64 `json:"denials_judged"`
	// MostInWindow is the most admissions of one client found inside one
	// window (whole send→receive intervals inside it, as over-admission
	// counts them).
	MostInWindow int64            `json:"most_in_window"`
	Findings     map[string]int64 `json:"findings"`
}

type kind uint8

const (
	admitted kind = iota + 1
	denied
	unknown // an error: it may or may not have been admitted
)

type entry struct {
	sent, recv time.Time
	kind       kind
	retry      time.Duration
	hasRetry   bool
	tags       map[string]string
	done       bool
}

type timelineKey struct {
	policy, region, pop string
	client              int
}

type timeline struct {
	policy  *Policy
	entries []*entry // ordered by recv
}

// Checker is safe for concurrent use.
type Checker struct {
	mu        sync.Mutex
	policies  map[string]*Policy
	timelines map[timelineKey]*timeline
	settled   time.Time // everything sent before this was evaluated
	stats     Stats
}

// New returns a checker for the given policies.
func New(policies []Policy) *Checker {
	c := &Checker{policies: map[string]*Policy{}, timelines: map[timelineKey]*timeline{}}
	for i := range policies {
		p := policies[i]
		c.policies[p.Name] = &p
	}
	c.stats.Findings = map[string]int64{OverAdmission: 0, FalseDenial: 0, BrokenPromise: 0}
	c.stats.ByPolicy = map[string]PolicyStats{}
	for name, p := range c.policies {
		if p.checksCounts() {
			c.stats.ByPolicy[name] = PolicyStats{Findings: map[string]int64{OverAdmission: 0, FalseDenial: 0, BrokenPromise: 0}}
		}
	}
	return c
}

// Policies returns the policies the checker knows, by name.
func (c *Checker) Policies() []Policy {
	out := make([]Policy, 0, len(c.policies))
	for _, p := range c.policies {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Policy) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// Record adds one response. It reports whether the event arrived after its
// time range was already evaluated (a request that outlived the settle
// time): such an event is still recorded, and counted in Stats.Late.
func (c *Checker) Record(ev Event) (late bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Events++
	if !c.settled.IsZero() && ev.Sent.Before(c.settled) {
		c.stats.Late++
		late = true
	}
	switch {
	case ev.Status == 429:
		if !ev.ViolatedRead {
			// We cannot tell which policy denied: nothing to check, but the
			// other policies were refunded, so they saw nothing either.
			c.stats.Unattributed++
			return late
		}
		c.stats.Denials++
		for _, name := range ev.Violated {
			c.add(ev, name, denied)
		}
	case ev.Status == 503:
		// Shed (before any limit) or fail-closed: no limit counted it.
	case ev.Status == 0 || (ev.Status >= 500 && len(ev.Applied) == 0):
		// Transport error or a server error without the fields: it may have
		// been admitted by any client-keyed policy.
		c.stats.Unknown++
		for name, p := range c.policies {
			if p.ClientKeyed {
				c.add(ev, name, unknown)
			}
		}
	default:
		if len(ev.Applied) > 0 {
			c.stats.Admissions++
		}
		for _, name := range ev.Applied {
			c.add(ev, name, admitted)
		}
	}
	return late
}

func (c *Checker) add(ev Event, name string, k kind) {
	p, ok := c.policies[name]
	if !ok {
		c.stats.UnknownPolicy++
		return
	}
	if !p.checksCounts() && !p.checksPromises() {
		return
	}
	key := timelineKey{policy: name, region: ev.Region, client: ev.Client}
	switch {
	case p.Global:
		key.region = "" // one quota for every region
	case p.PerPoP:
		key.pop = ev.PoP
	}
	tl := c.timelines[key]
	if tl == nil {
		tl = &timeline{policy: p}
		c.timelines[key] = tl
	}
	e := &entry{sent: ev.Sent, recv: ev.Recv, kind: k, retry: ev.RetryAfter, hasRetry: ev.HasRetry, tags: ev.Tags}
	// Responses arrive nearly in receive order: insert from the back.
	i := len(tl.entries)
	for i > 0 && tl.entries[i-1].recv.After(e.recv) {
		i--
	}
	tl.entries = slices.Insert(tl.entries, i, e)
}

// Flush evaluates every entry received at or before settled, which must be
// a time before which every request has been recorded (now minus the
// longest a request can take). Use a far-future time at the end of a run.
func (c *Checker) Flush(settled time.Time) []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	if settled.After(c.settled) {
		c.settled = settled
	}
	var out []Finding
	for key, tl := range c.timelines {
		out = tl.evaluate(key, settled, &c.stats, out)
		tl.prune(settled)
		if len(tl.entries) == 0 {
			delete(c.timelines, key)
		}
	}
	for _, f := range out {
		c.stats.Findings[f.Kind]++
		if ps, ok := c.stats.ByPolicy[f.Policy]; ok {
			ps.Findings[f.Kind]++
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Recv.Before(out[j].Recv) })
	return out
}

// Stats returns the counts so far.
func (c *Checker) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Findings = maps.Clone(c.stats.Findings)
	s.ByPolicy = map[string]PolicyStats{}
	for name, ps := range c.stats.ByPolicy {
		ps.Findings = maps.Clone(ps.Findings)
		s.ByPolicy[name] = ps
	}
	return s
}

func (tl *timeline) evaluate(key timelineKey, settled time.Time, st *Stats, out []Finding) []Finding {
	p := tl.policy
	ps, counted := st.ByPolicy[key.policy]
	defer func() {
		if counted {
			st.ByPolicy[key.policy] = ps
		}
	}()
	for i, e := range tl.entries {
		if e.done {
			continue
		}
		if e.recv.After(settled) {
			break
		}
		e.done = true
		found := func(kind, detail string, evidence []Interval) {
			out = append(out, Finding{Kind: kind, Policy: key.policy, Region: key.region, PoP: key.pop,
				Client: key.client, Sent: e.sent, Recv: e.recv, Tags: e.tags, Detail: detail, Evidence: evidence})
		}
		switch e.kind {
		case admitted:
			if p.checksPromises() {
				if _, ok := tl.promiseTested(i); ok {
					st.PromisesTested++
				}
			}
			if p.checksCounts() {
				st.CheckedCounts++
				ps.Admissions++
				n, ev, ok := tl.overAdmitted(i)
				ps.MostInWindow = max(ps.MostInWindow, n)
				if ok {
					found(OverAdmission, fmt.Sprintf("%d admissions inside one %s window of %s (q=%d, bound %d)", n, p.Window, p.Algorithm, p.Quota, p.Bound()), ev)
				}
			}
		case denied:
			// A denial can be both: below quota and after a promise.
			if p.checksCounts() && p.MinInterval == 0 {
				st.CheckedCounts++
				ps.Denials++
				if n, ev, ok := tl.falselyDenied(i); ok {
					found(FalseDenial, fmt.Sprintf("denied with at most %d possible admissions in the window (q=%d)", n, p.Quota), ev)
				}
			}
			if p.checksPromises() {
				if prev, ok := tl.promiseTested(i); ok {
					st.PromisesTested++
					found(BrokenPromise, fmt.Sprintf("sent %s after a 429 whose Retry-After was %s, no admission in between, denied again",
						d(e.sent.Sub(prev.recv)), prev.retry), []Interval{prev.interval()})
				}
			}
		}
	}
	return out
}

// overAdmitted: counting j = entries[i] as the newest admission, are there
// more than q admissions whose intervals all fit in a span shorter than the
// window (sliding_log), or inside j's fixed window?
func (tl *timeline) overAdmitted(i int) (int64, []Interval, bool) {
	p, j := tl.policy, tl.entries[i]
	lo, hi := j.recv.Add(-p.Window), time.Time{}
	if p.Algorithm == FixedWindow {
		lo = windowStart(j.sent, p.Window)
		hi = lo.Add(p.Window)
		if !j.recv.Before(hi) {
			return 0, nil, false // j straddles a boundary: it may count in either window
		}
	}
	var n int64
	var ev []Interval
	for k := i; k >= 0; k-- {
		e := tl.entries[k]
		if e.recv.Before(lo) || (p.Algorithm == SlidingLog && e.recv.Equal(lo)) {
			break // sent no later than lo: outside, as is every earlier entry
		}
		if e.kind != admitted || e.recv.After(j.recv) {
			continue
		}
		inside := e.sent.After(lo)
		if p.Algorithm == FixedWindow {
			inside = !e.sent.Before(lo) && e.recv.Before(hi)
		}
		if inside {
			n++
			ev = append(ev, e.interval())
		}
	}
	if n <= p.Bound() {
		return n, nil, false
	}
	slices.Reverse(ev)
	return n, ev, true
}

func (e *entry) interval() Interval {
	k := map[kind]string{admitted: "admitted", denied: "denied", unknown: "unknown"}[e.kind]
	return Interval{Sent: e.sent, Recv: e.recv, Kind: k}
}

// falselyDenied: at most how many admissions could the server have counted
// when it denied d = entries[i]? Every admission or unknown outcome whose
// interval could overlap a window ending somewhere in d's interval.
func (tl *timeline) falselyDenied(i int) (int64, []Interval, bool) {
	p, d := tl.policy, tl.entries[i]
	possible := func(lo, hi time.Time) []Interval { // intervals touching [lo, hi] and sent before d was answered
		var out []Interval
		for _, e := range tl.entries {
			if e.kind == denied || e.recv.Before(lo) || e.sent.After(hi) || e.sent.After(d.recv) {
				continue
			}
			out = append(out, e.interval())
		}
		return out
	}
	var most []Interval
	if p.Algorithm == FixedWindow {
		for ws := windowStart(d.sent, p.Window); !ws.After(d.recv); ws = ws.Add(p.Window) {
			if in := possible(ws, ws.Add(p.Window)); len(in) > len(most) {
				most = in
			}
		}
	} else {
		// Windows (t−W, t] for t in [sent, recv]: their union is (sent−W, recv].
		most = possible(d.sent.Add(-p.Window), d.recv)
	}
	n := int64(len(most))
	if n >= p.Quota {
		return n, nil, false
	}
	return n, most, true
}

// promiseTested: is there an earlier 429 p of this timeline whose
// Retry-After had passed when d = entries[i] was sent, with no other
// possible admission between p's send and d's receipt? If d was denied,
// p's promise is broken; if admitted, kept.
func (tl *timeline) promiseTested(i int) (*entry, bool) {
	d := tl.entries[i]
	// The latest receipt of any possible admission sent before d was
	// answered (entries are in receive order, so the first found from the
	// end): a 429 sent after it had no admission between it and d.
	var lastAdmit time.Time
	for k := len(tl.entries) - 1; k >= 0; k-- {
		if e := tl.entries[k]; k != i && e.kind != denied && !e.sent.After(d.recv) {
			lastAdmit = e.recv
			break
		}
	}
	for k := i - 1; k >= 0; k-- {
		e := tl.entries[k]
		if e.recv.Before(lastAdmit) {
			break // sent before lastAdmit too, as is every earlier entry
		}
		if e.kind != denied || !e.hasRetry || !e.sent.After(lastAdmit) {
			continue
		}
		if e.recv.Add(e.retry).After(d.sent) {
			continue // d came too early to test this promise
		}
		return e, true
	}
	return nil, false
}

// prune drops evaluated entries too old to matter for any later decision.
func (tl *timeline) prune(settled time.Time) {
	keep := settled.Add(-3*tl.policy.Window - time.Minute)
	n := 0
	for n < len(tl.entries) && tl.entries[n].done && tl.entries[n].recv.Before(keep) {
		n++
	}
	tl.entries = tl.entries[n:]
}

func d(x time.Duration) time.Duration { return x.Round(time.Millisecond) }

func windowStart(t time.Time, w time.Duration) time.Time {
	return time.Unix(0, t.UnixNano()-t.UnixNano()%int64(w))
}
