package ruletest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// The lints: each names rules that cannot do what they seem to.
const (
	// LintStrippedHeader: a rule reads a header the trust model removes
	// (from untrusted peers, or from every peer), so it never applies to
	// those requests.
	LintStrippedHeader = "stripped-header"
	// LintNeverDenies: a rule's match lies within an earlier rule's, with
	// the same key and counting and a limit no lower, so it denies nothing
	// the earlier rule admits (rules have no first-match: every rule that
	// matches counts, so this is what shadowing means here).
	LintNeverDenies = "never-denies"
	// LintRefusedMethod: a rule matches only methods the edge refuses (405)
	// unless --allow-methods names them.
	LintRefusedMethod = "refused-method"
)

// Warning is one lint's finding about one rule.
type Warning struct {
	Rule string `json:"rule"`
	Lint string `json:"lint"`
	Msg  string `json:"message"`
}

func (w Warning) String() string { return "rule " + w.Rule + ": " + w.Msg + " [" + w.Lint + "]" }

// Lint reports the rules of doc that can never do what they seem to. An
// error is a document that does not compile.
func Lint(doc *rules.Document) ([]Warning, error) {
	snap, err := rules.Compile(doc)
	if err != nil {
		return nil, err
	}
	rs := snap.Rules()
	var out []Warning
	for i := range rs {
		r := &rs[i]
		out = append(out, strippedHeaders(r)...)
		if w, ok := refusedMethods(r); ok {
			out = append(out, w)
		}
		for j := range i {
			if covers(&rs[j], r) {
				out = append(out, Warning{Rule: r.ID, Lint: LintNeverDenies, Msg: fmt.Sprintf(
					"never denies a request that rule %s admits: its match lies within %s's, with the same key, algorithm, window and cost and a limit no lower", rs[j].ID, rs[j].ID)})
				break
			}
		}
	}
	return out, nil
}

// strippedHeaders asks the trust screen itself which of the headers the
// rule reads it removes.
func strippedHeaders(r *rules.CompiledRule) []Warning {
	var out []Warning
	check := func(name, use string) {
		switch {
		case screened(name, true):
			out = append(out, Warning{Rule: r.ID, Lint: LintStrippedHeader, Msg: fmt.Sprintf(
				"%s: the edge removes %s from every peer (a name with an underscore; --allow-underscores-in-headers), so the rule never applies", use, name)})
		case screened(name, false):
			out = append(out, Warning{Rule: r.ID, Lint: LintStrippedHeader, Msg: fmt.Sprintf(
				"%s: the edge removes %s from peers that are not trusted proxies, so the rule never applies to their requests (key by ip: the client address the trust model names)", use, name)})
		}
	}
	for _, k := range r.Key {
		if name, ok := strings.CutPrefix(k, "header:"); ok {
			check(name, "key "+k)
		}
	}
	if h := r.Bypass.APIKeyHeader; h != "" {
		check(h, "bypass.api_key_header")
	}
	return out
}

// screened reports whether trust.Screen removes a field named name from a
// peer trusted or not.
func screened(name string, trusted bool) bool {
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	h.Set(name, "x")
	return trust.Screen{}.Apply(&h, trusted, [2]string{}) > 0
}

func refusedMethods(r *rules.CompiledRule) (Warning, bool) {
	if len(r.Methods) == 0 {
		return Warning{}, false
	}
	for _, m := range r.Methods {
		if config.RefusedMethod([]byte(m)) == "" {
			return Warning{}, false
		}
	}
	return Warning{Rule: r.ID, Lint: LintRefusedMethod, Msg: fmt.Sprintf(
		"matches only %s, which the edge refuses (405) unless --allow-methods names them", strings.Join(r.Methods, ", "))}, true
}

// covers reports whether every request later matches, earlier matches too
// and counts the same way by the same key with a limit no higher, so later
// never denies alone. Rules with escapes or counted by the response are
// left alone: their counts differ in ways a lint cannot see.
func covers(earlier, later *rules.CompiledRule) bool {
	plain := func(r *rules.CompiledRule) bool {
		return !r.Shadow && r.Overrides == 0 && r.LimitHeader == "" && r.Penalty == 0 && !r.Behaviour &&
			r.Tolerance == 0 && len(r.CountIf.Status) == 0 && r.CountIf.Header == "" && r.CostHeader == "" &&
			len(r.Bypass.CIDRs) == 0 && len(r.Bypass.Hosts) == 0 && len(r.Bypass.PathPrefix) == 0 && r.Bypass.APIKeyHeader == ""
	}
	if !plain(earlier) || !plain(later) ||
		!slices.Equal(earlier.Key, later.Key) || earlier.Algorithm != later.Algorithm || earlier.Window != later.Window ||
		earlier.Cost != later.Cost || earlier.MinInterval != later.MinInterval || earlier.Scope != later.Scope ||
		later.Limit < earlier.Limit || later.Burst < earlier.Burst {
		return false
	}
	return within(later.Methods, earlier.Methods, func(m, e string) bool { return m == e }) &&
		within(later.Hosts, earlier.Hosts, hostWithin) &&
		within(later.PathPrefix, earlier.PathPrefix, prefixWithin)
}

// within reports whether every request a list (empty: any) admits, outer
// admits too.
func within(inner, outer []string, in func(i, o string) bool) bool {
	if len(outer) == 0 || slices.Contains(outer, "/") {
		return true
	}
	if len(inner) == 0 || slices.Contains(inner, "/") {
		return false
	}
	for _, i := range inner {
		if !slices.ContainsFunc(outer, func(o string) bool { return in(i, o) }) {
			return false
		}
	}
	return true
}

// hostWithin: every host pattern i names, pattern o names too.
func hostWithin(i, o string) bool {
	if i == o {
		return true
	}
	suf, ok := strings.CutPrefix(o, "*")
	// "*.example.com" covers "a.example.com" and "*.a.example.com", not
	// the apex.
	return ok && len(strings.TrimPrefix(i, "*")) > len(suf) && strings.HasSuffix(i, suf)
}

// prefixWithin: every path under prefix i is under prefix o (segment
// boundaries, as rules match).
func prefixWithin(i, o string) bool {
	return strings.HasPrefix(i, o) && (len(i) == len(o) || i[len(o)] == '/')
}
