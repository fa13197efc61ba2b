package ruletest

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/reqhead"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Result is one case's outcome: Diffs is empty when it passed.
type Result struct {
	Name  string   `json:"name"`
	Pass  bool     `json:"pass"`
	Diffs []string `json:"diffs,omitempty"` // "matches: expected [a b], got [a]"
}

// epoch is where a case's frozen clock starts: a fixed instant, so window
// boundaries fall in the same place on every run.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs every case of f against doc and returns their results in order.
// An error is a document the edge would not load.
func Run(f *File, doc *rules.Document) ([]Result, error) {
	var opts []rules.CompileOption
	if f.IPv6Prefix > 0 {
		opts = append(opts, rules.WithIPv6Prefix(f.IPv6Prefix))
	}
	snap, err := rules.Compile(doc, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]Result, 0, len(f.Tests))
	for i := range f.Tests {
		r, err := f.run(snap, &f.Tests[i])
		if err != nil {
			return nil, fmt.Errorf("test %q: %w", f.Tests[i].Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// got is what came of a case, in the terms of Expect.
type got struct {
	refused  int
	why      string
	client   netip.Addr
	matches  []string
	bypassed []string
	keys     map[string]string
	allowed  int
	denied   int
	status   int
	violated []string
}

func (f *File) run(snap *rules.Snapshot, c *Case) (Result, error) {
	g, err := f.send(snap, c)
	if err != nil {
		return Result{}, err
	}
	res := Result{Name: c.Name}
	e := c.Expect
	diff := func(what string, want, have any) {
		res.Diffs = append(res.Diffs, fmt.Sprintf("%s: expected %v, got %v", what, want, have))
	}
	if e.Refused != g.refused {
		diff("refused", refusal(e.Refused, ""), refusal(g.refused, g.why))
	}
	if e.Client != "" && g.client.IsValid() {
		if want := netip.MustParseAddr(e.Client).Unmap(); want != g.client {
			diff("client", want, g.client)
		}
	}
	if e.Matches != nil && !slices.Equal(*e.Matches, g.matches) {
		diff("matches", list(*e.Matches), list(g.matches))
	}
	if e.Bypassed != nil && !slices.Equal(*e.Bypassed, g.bypassed) {
		diff("bypassed", list(*e.Bypassed), list(g.bypassed))
	}
	for _, id := range sortedKeys(e.Keys) {
		k := e.Keys[id]
		want := k.Key
		if k.Parts != nil {
			if want, err = snap.KeyOf(id, k.Parts); err != nil {
				return Result{}, fmt.Errorf("expect.keys.%s: %w", id, err)
			}
		}
		have, ok := g.keys[id]
		switch {
		case !ok:
			diff("keys."+id, describeKey(k, want), "no key (the rule does not count the request)")
		case have != want:
			diff("keys."+id, describeKey(k, want), have)
		}
	}
	if e.Allowed != nil && *e.Allowed != g.allowed {
		diff("allowed", *e.Allowed, g.allowed)
	}
	if e.Denied != nil && *e.Denied != g.denied {
		diff("denied", *e.Denied, g.denied)
	}
	if e.Status != 0 && e.Status != g.status {
		diff("status", e.Status, g.status)
	}
	if e.Violated != nil && !slices.Equal(*e.Violated, g.violated) {
		diff("violated", list(*e.Violated), list(g.violated))
	}
	res.Pass = len(res.Diffs) == 0
	return res, nil
}

// send sends c's request Repeat times through the edge's steps before the
// proxy: screen, identify, match, checks, limit.
func (f *File) send(snap *rules.Snapshot, c *Case) (got, error) {
	var g got
	req := &c.Request
	peer := netip.MustParseAddr(req.Peer).Unmap()
	trusted := trust.Set(f.trusted)
	if req.Trusted {
		trusted = append(slices.Clone(trusted), netip.PrefixFrom(peer, peer.BitLen()))
	}
	// The request as the edge's HTTP/1 server reads it off the wire.
	var r fasthttp.Request
	if err := r.Read(bufio.NewReader(strings.NewReader(wire(req)))); err != nil {
		g.refused, g.why = fasthttp.StatusBadRequest, "malformed request: "+err.Error()
		return g, nil
	}
	// Screen (pipeline/stage_screen.go): method, Host, then what the peer
	// may not send.
	if m := config.RefusedMethod(r.Header.Method()); m != "" && !slices.Contains(f.AllowMethods, m) {
		g.refused, g.why = fasthttp.StatusMethodNotAllowed, "method "+m+" is not allowed"
		return g, nil
	}
	isTrusted := trusted.Contains(peer)
	if why := reqhead.SettleHost(&r, f.DefaultHost, config.UsableHost); why != "" {
		g.refused, g.why = fasthttp.StatusBadRequest, why
		return g, nil
	}
	trust.Screen{}.Apply(&r.Header, isTrusted, [2]string{})
	// Identify (stage_identify.go) and Match (stage_match.go).
	look := reqhead.New(&r.Header, r.URI().QueryArgs())
	g.client = trust.Client(peer, r.Header.PeekAll("X-Forwarded-For"), trusted)
	rq := rules.Request{
		Host:     rules.NormalizeHost(string(r.Header.Host())),
		Method:   string(r.Header.Method()),
		Path:     rules.NormalizePath(string(r.URI().PathOriginal())),
		ClientIP: g.client,
		Header:   look.Get,
		Query:    look.Query,
	}
	ms := snap.Match(&rq, nil)
	if why := look.Repeated(); why != "" {
		g.refused, g.why = fasthttp.StatusBadRequest, why+" is repeated"
		return g, nil
	}
	// Checks (stage_checks.go): bypassed rules drop out, response-counted
	// ones wait for a response the test does not have.
	g.keys = map[string]string{}
	var checks []limiter.Check
	var counted []*rules.CompiledRule
	g.matches, g.bypassed = []string{}, []string{}
	for _, m := range ms {
		if m.Bypass {
			g.bypassed = append(g.bypassed, m.Rule.ID)
			continue
		}
		g.matches = append(g.matches, m.Rule.ID)
		g.keys[m.Rule.ID] = m.Key
		if m.Rule.CountIf.Status != nil || m.Rule.CountIf.Header != "" || m.Rule.CostHeader != "" {
			continue
		}
		// The key's override or a trusted peer's limit header (escapes.go).
		l, _, _ := rules.LimitOf(m, m.Key, isTrusted, look.Get)
		checks = append(checks, limiter.Check{Limit: l, Cost: m.Rule.Cost, Shadow: m.Rule.Shadow})
		counted = append(counted, m.Rule)
	}
	// Limit (stage_limit.go), on a clock that moves only between requests.
	// The limiter may read it from goroutines of its own.
	var now atomic.Int64
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	lim, err := limiter.New(limiter.NewMemoryStore(limiter.WithClock(clock)), limiter.Config{StoreName: "memory", Now: clock}, nil, nil)
	if err != nil {
		return g, err
	}
	defer lim.Close()
	g.status = fasthttp.StatusOK
	for i := range c.Repeat {
		now.Store(epoch.Add(time.Duration(i) * time.Duration(c.Every)).UnixNano())
		if len(checks) == 0 {
			g.allowed++
			continue
		}
		v, err := lim.Decide(context.Background(), checks)
		if err != nil {
			return g, fmt.Errorf("the limiter refused the checks: %w", err)
		}
		g.status, g.violated = fasthttp.StatusOK, nil
		if v.Allowed {
			g.allowed++
			continue
		}
		g.denied++
		g.status = fasthttp.StatusTooManyRequests
		for j, o := range v.Checks {
			if !o.Allowed && !checks[j].Shadow && o.Source != limiter.SourceSkipped {
				g.violated = append(g.violated, counted[j].ID)
			}
		}
	}
	if g.violated == nil {
		g.violated = []string{}
	}
	return g, nil
}

// wire is the request's bytes as a client sends them, header fields in
// name order (a list: its values in order). Without a Host it is an
// HTTP/1.0 request, the only kind that may omit it.
func wire(r *Request) string {
	var b strings.Builder
	if r.Host == "" {
		b.WriteString(r.Method + " " + r.Path + " HTTP/1.0\r\n")
	} else {
		b.WriteString(r.Method + " " + r.Path + " HTTP/1.1\r\nHost: " + r.Host + "\r\n")
	}
	for _, k := range sortedKeys(r.Headers) {
		for _, v := range r.Headers[k] {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func list(s []string) string { return "[" + strings.Join(s, " ") + "]" }

func refusal(status int, why string) string {
	if status == 0 {
		return "not refused"
	}
	if why == "" {
		return strconv.Itoa(status)
	}
	return strconv.Itoa(status) + " (" + why + ")"
}

func describeKey(k Key, key string) string {
	if k.Parts != nil {
		return key + " (from " + list(k.Parts) + ")"
	}
	return key
}
