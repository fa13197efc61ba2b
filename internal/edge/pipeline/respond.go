package pipeline

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/internal/reqhead"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// applied is one non-shadow rule's answer, as clients see it.
type applied struct {
	rule    *rules.CompiledRule
	out     limiter.Decision
	skipped bool // not evaluated: another rule had already denied
	shadow  bool // counted only: a shadow rule, or the enforcement switch
}

// seconds rounds a duration up to whole seconds: a client told to wait never
// comes back early.
func seconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// setRateLimitFields writes the RateLimit-Policy and RateLimit fields
// (IETF httpapi-ratelimit-headers): one item per applied non-shadow rule.
//
//	RateLimit-Policy: "per-ip";q=100;w=60
//	RateLimit: "per-ip";r=37;t=12
func setRateLimitFields(h *fasthttp.ResponseHeader, as []applied, legacy bool) {
	if len(as) == 0 {
		return
	}
	// The fields in the casing the draft (and the README) spells, which
	// fasthttp's Set would turn into Ratelimit-Policy: any the origin sent
	// go first (Del matches case-insensitively), ours are set as spelled.
	if hasRateLimitField(h) { // rare: one pass over the fields first
		for _, k := range rateLimitFields {
			h.DelBytes(k)
		}
	}
	writeRateLimitFields(h, as, legacy, nil)
}

// writeRateLimitFields is setRateLimitFields for an answer the edge made
// itself (a 429): it holds no origin field to give way, and the pass over
// its fields is spared. one is as[0]'s policy when the caller has it
// (nil: looked up here).
func writeRateLimitFields(h *fasthttp.ResponseHeader, as []applied, legacy bool, one *rulePolicy) {
	if len(as) == 0 {
		return
	}
	// One rule (the usual case): its policy looked up once.
	if len(as) == 1 && one == nil {
		one = policyOf(as[0].rule)
	}
	var buf [256]byte
	state := buf[:0]
	tightest := -1
	for i, a := range as {
		if a.skipped {
			continue
		}
		if len(state) > 0 {
			state = append(state, ", "...)
		}
		p := one
		if len(as) > 1 {
			p = policyOf(a.rule)
		}
		state = appendState(state, p.id, a.out)
		if tightest < 0 || a.out.Remaining < as[tightest].out.Remaining {
			tightest = i
		}
	}
	if len(as) == 1 {
		h.SetCanonical(fieldPolicy, one.item)
	} else {
		var pbuf [256]byte
		policy := pbuf[:0]
		for i, a := range as {
			if i > 0 {
				policy = append(policy, ", "...)
			}
			policy = append(policy, policyOf(a.rule).item...)
		}
		h.SetCanonical(fieldPolicy, policy)
	}
	if len(state) > 0 {
		h.SetCanonical(fieldState, state)
	}
	if legacy && tightest >= 0 {
		t := as[tightest]
		var num [20]byte
		h.SetCanonical(fieldLegacyLimit, strconv.AppendInt(num[:0], quota(t.rule), 10))
		h.SetCanonical(fieldLegacyRemaining, strconv.AppendInt(num[:0], t.out.Remaining, 10))
		h.SetCanonical(fieldLegacyReset, strconv.AppendInt(num[:0], seconds(t.out.ResetAfter), 10))
	}
}

// appendState appends a rule's RateLimit item: its quoted id, what is
// left and when the window resets.
func appendState(b []byte, id string, d limiter.Decision) []byte {
	b = append(b, id...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, seconds(d.ResetAfter), 10)
}

var (
	fieldPolicy          = []byte("RateLimit-Policy")
	fieldState           = []byte("RateLimit")
	fieldLegacyLimit     = []byte("X-RateLimit-Limit")
	fieldLegacyRemaining = []byte("X-RateLimit-Remaining")
	fieldLegacyReset     = []byte("X-RateLimit-Reset")
	rateLimitFields      = [][]byte{fieldPolicy, fieldState, fieldLegacyLimit, fieldLegacyRemaining, fieldLegacyReset}
)

// hasRateLimitField reports whether h holds one of rateLimitFields, in any
// casing.
func hasRateLimitField(h *fasthttp.ResponseHeader) bool {
	for k := range h.All() {
		if isRateLimitField(k) {
			return true
		}
	}
	return false
}

// isRateLimitField reports whether k is one of rateLimitFields, in any
// casing: its length and first byte pick the one name to compare, so an
// origin's other fields cost a switch each.
func isRateLimitField(k []byte) bool {
	var lower string
	switch len(k) {
	case len(fieldState):
		lower = "ratelimit"
	case len(fieldPolicy):
		lower = "ratelimit-policy"
	case len(fieldLegacyLimit): // and X-RateLimit-Reset
		switch k[12] | 0x20 { // X-RateLimit-[LR]
		case 'l':
			lower = "x-ratelimit-limit"
		case 'r':
			lower = "x-ratelimit-reset"
		default:
			return false
		}
	case len(fieldLegacyRemaining):
		lower = "x-ratelimit-remaining"
	default:
		return false
	}
	return reqhead.FoldEqual(k, lower)
}

// quota is q: the most units the rule admits in its window (a bucket's
// capacity, a concurrency rule's slots).
func quota(r *rules.CompiledRule) int64 { return ruleLimit(r, "").Capacity() }

// rulePolicy is what a rule writes into an answer whatever the request:
// its quoted id and its RateLimit-Policy item for the RateLimit fields, and
// the problem document of a 429 it alone denied.
type rulePolicy struct {
	id           string
	item, denied []byte
	// head is the header of a 429 this rule alone answers (deniedHead),
	// built at the rule's first such denial.
	head atomic.Pointer[fasthttp.ResponseHeader]
}

// policyEntry is a rule's cached policy.
type policyEntry struct {
	rule *rules.CompiledRule
	rulePolicy
}

// policies caches each compiled rule's rulePolicy: a compiled rule never
// changes, so its item and its 429's body are built once, not per
// response. Rules reloads forget them (ForgetPolicies); so does growing
// past maxPolicies.
var (
	policies  sync.Map // *rules.CompiledRule → *policyEntry
	policiesN atomic.Int64
)

const maxPolicies = 1 << 16

func policyOf(r *rules.CompiledRule) *rulePolicy { return &policyEntryOf(r).rulePolicy }

// lastPolicyOf is policyOf through last, the caller's own record of the
// entry it asked for last (a scratch's): a flood of denials by one rule
// finds its policy with a comparison, where the map hashes the rule's
// pointer as an interface. Its own, not one the goroutines share: a
// shared one would be written on every change of rule, from every core.
func lastPolicyOf(r *rules.CompiledRule, last **policyEntry) *rulePolicy {
	if e := *last; e != nil && e.rule == r {
		return &e.rulePolicy
	}
	e := policyEntryOf(r)
	*last = e
	return &e.rulePolicy
}

func policyEntryOf(r *rules.CompiledRule) *policyEntry {
	if p, ok := policies.Load(r); ok {
		return p.(*policyEntry)
	}
	id := strconv.Quote(r.ID)
	item := id + ";q=" + strconv.FormatInt(quota(r), 10)
	if !r.Algorithm.Spec().Held { // held units have no window
		item += ";w=" + strconv.FormatInt(seconds(r.Window), 10)
	}
	e := &policyEntry{rule: r, rulePolicy: rulePolicy{id: id, item: []byte(item), denied: quotaExceeded([]string{r.ID}).AppendJSON(nil)}}
	if policiesN.Add(1) > maxPolicies {
		ForgetPolicies()
	}
	policies.Store(r, e)
	return e
}

// ForgetPolicies drops the cached policies of the rules (the edge calls it
// when it swaps them). A scratch keeps the entry it used last until it
// serves another rule: still right for its rule, which it keeps in memory
// until then.
func ForgetPolicies() {
	policies.Clear()
	policiesN.Store(0)
}

// deny answers 429 for the rules that denied: with one rule denying (a
// flood's usual case), the body its policy keeps (found through last, as
// lastPolicyOf does); with more, one built here.
func deny(ctx *fasthttp.RequestCtx, as []applied, legacy bool, last **policyEntry) {
	var violatedBuf [8]string
	violated := violatedBuf[:0]
	var retry time.Duration
	var only *rules.CompiledRule
	for _, a := range as {
		if !a.skipped && !a.out.Allowed {
			violated = append(violated, a.rule.ID)
			retry = max(retry, a.out.RetryAfter, time.Second)
			only = a.rule
		}
	}
	var one *rulePolicy // as[0]'s, when it is the only rule
	if len(violated) == 1 {
		p := lastPolicyOf(only, last)
		if len(as) == 1 && !legacy { // a flood's 429, copied (deniedHead)
			denyOne(ctx, p, as[0].out, seconds(retry))
			return
		}
		if len(as) == 1 {
			one = p
		}
		problem.WriteBody(ctx, fasthttp.StatusTooManyRequests, p.denied, seconds(retry))
	} else {
		var buf [512]byte
		problem.WriteBody(ctx, fasthttp.StatusTooManyRequests, quotaExceeded(violated).AppendJSON(buf[:0]), seconds(retry))
	}
	writeRateLimitFields(&ctx.Response.Header, as, legacy, one)
}

// denyOne is deny for one rule, the only one applied, without the legacy
// fields: the answer to every request of a one-key flood. Its header is
// the rule's deniedHead with the two values a denial changes set in place
// (each field set through fasthttp costs about 380 instructions, four of
// them a tenth of a denial); TestDenyOneIsTheGeneralAnswer holds it to
// the bytes deny's general path writes.
func denyOne(ctx *fasthttp.RequestCtx, p *rulePolicy, out limiter.Decision, retry int64) {
	ctx.Response.Reset()
	p.deniedHead().CopyTo(&ctx.Response.Header)
	problem.SetRetryAfter(&ctx.Response.Header, retry)
	var buf [128]byte
	ctx.Response.Header.SetCanonical(fieldState, appendState(buf[:0], p.id, out))
	ctx.SetBody(p.denied)
}

// deniedHead is the header of a 429 that p's rule alone answers, as deny's
// general path writes it (problem.WriteBody, then writeRateLimitFields)
// for a placeholder decision: a denial copies it and sets Retry-After and
// RateLimit. Read-only once built; two denials building it at once build
// the same.
func (p *rulePolicy) deniedHead() *fasthttp.ResponseHeader {
	if h := p.head.Load(); h != nil {
		return h
	}
	var ctx fasthttp.RequestCtx
	problem.WriteBody(&ctx, fasthttp.StatusTooManyRequests, p.denied, 1)
	writeRateLimitFields(&ctx.Response.Header, []applied{{}}, false, p)
	h := &fasthttp.ResponseHeader{}
	ctx.Response.Header.CopyTo(h)
	p.head.Store(h)
	return h
}

// quotaExceeded is the problem a 429 answers, for the rules violated.
func quotaExceeded(violated []string) problem.Problem {
	return problem.Problem{
		Type:     problem.QuotaExceeded,
		Title:    "Too Many Requests",
		Status:   fasthttp.StatusTooManyRequests,
		Detail:   "request quota exceeded; retry after the time in Retry-After",
		Violated: violated,
	}
}
