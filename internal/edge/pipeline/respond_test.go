package pipeline

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// An origin's own RateLimit fields, in any casing, give way to the edge's:
// one of each goes out, the edge's, spelled as the draft spells them; an
// origin that sends none keeps every field it sent.
func TestOriginRateLimitFieldsGiveWay(t *testing.T) {
	rule := &rules.CompiledRule{ID: "per-ip", Algorithm: limit.FixedWindow, Limit: 3, Window: time.Minute}
	as := []applied{{rule: rule, out: limiter.Decision{Limit: 3, Remaining: 2, ResetAfter: time.Minute}}}
	for name, origin := range map[string]string{
		"none":   "X-Origin: kept\r\n",
		"casing": "ratelimit-policy: \"origin\";q=9\r\nRATELIMIT: \"origin\";r=9;t=1\r\nx-ratelimit-limit: 9\r\nX-Origin: kept\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			var h fasthttp.ResponseHeader
			raw := "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + origin + "\r\n"
			require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw))))
			setRateLimitFields(&h, as, true)
			out := h.String()
			for field, want := range map[string]string{
				"RateLimit-Policy":      `"per-ip";q=3;w=60`,
				"RateLimit":             `"per-ip";r=2;t=60`,
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": "2",
				"X-RateLimit-Reset":     "60",
			} {
				require.Equal(t, 1, bytes.Count(bytes.ToLower([]byte(out)), []byte("\r\n"+strings.ToLower(field)+": ")), "%s in\n%s", field, out)
				require.Contains(t, out, "\r\n"+field+": "+want+"\r\n")
			}
			require.Contains(t, out, "\r\nX-Origin: kept\r\n")
			require.NotContains(t, out, "origin\"")
		})
	}
}

// A 429 names the rules that denied, in its body and its RateLimit fields,
// whichever rules were asked about before it: the policies the responses
// keep (policyOf, and a scratch's last one) never answer for another rule,
// not after a reload forgot them, not while other rules' denials run
// beside it.
func TestDenyNamesItsOwnRules(t *testing.T) {
	a := &rules.CompiledRule{ID: "per-ip", Algorithm: limit.FixedWindow, Limit: 3, Window: time.Minute}
	b := &rules.CompiledRule{ID: "per-key", Algorithm: limit.FixedWindow, Limit: 7, Window: time.Hour}
	over := limiter.Decision{Limit: 3, Remaining: 0, ResetAfter: 20 * time.Second, RetryAfter: 20 * time.Second}
	under := limiter.Decision{Allowed: true, Limit: 7, Remaining: 5, ResetAfter: time.Hour}
	type want struct{ violated, policy, state string }
	cases := []struct {
		name string
		as   []applied
		want want
	}{
		{"a", []applied{{rule: a, out: over}}, want{`["per-ip"]`, `"per-ip";q=3;w=60`, `"per-ip";r=0;t=20`}},
		{"b", []applied{{rule: b, out: over}}, want{`["per-key"]`, `"per-key";q=7;w=3600`, `"per-key";r=0;t=20`}},
		{"a of two", []applied{{rule: a, out: over}, {rule: b, out: under}}, want{`["per-ip"]`, `"per-ip";q=3;w=60, "per-key";q=7;w=3600`, `"per-ip";r=0;t=20, "per-key";r=5;t=3600`}},
		{"b of two", []applied{{rule: a, out: under}, {rule: b, out: over}}, want{`["per-key"]`, `"per-ip";q=3;w=60, "per-key";q=7;w=3600`, `"per-ip";r=5;t=3600, "per-key";r=0;t=20`}},
		{"both", []applied{{rule: a, out: over}, {rule: b, out: over}}, want{`["per-ip","per-key"]`, `"per-ip";q=3;w=60, "per-key";q=7;w=3600`, `"per-ip";r=0;t=20, "per-key";r=0;t=20`}},
	}
	check := func(t require.TestingT, as []applied, w want, last **policyEntry) {
		var ctx fasthttp.RequestCtx
		deny(&ctx, as, false, last)
		h := &ctx.Response.Header
		require.Equal(t, fasthttp.StatusTooManyRequests, ctx.Response.StatusCode())
		require.Contains(t, string(ctx.Response.Body()), `"violated-policies":`+w.violated+`}`)
		require.Equal(t, w.policy, fieldAsSpelled(h, "RateLimit-Policy"))
		require.Equal(t, w.state, fieldAsSpelled(h, "RateLimit"))
		require.Equal(t, "20", string(h.Peek("Retry-After")))
	}
	// Each after every other through one scratch's record of the last
	// policy, and after a reload forgot the policies.
	var last *policyEntry
	for _, forget := range []bool{false, true} {
		for _, first := range cases {
			for _, c := range cases {
				check(t, first.as, first.want, &last)
				if forget {
					ForgetPolicies()
				}
				check(t, c.as, c.want, &last)
			}
		}
	}
	// Side by side: each goroutine's answers stay its rules'.
	var wg sync.WaitGroup
	errs := make(chan error, len(cases))
	for _, c := range cases {
		wg.Go(func() {
			var last *policyEntry
			for range 200 {
				var rec recorder
				if check(&rec, c.as, c.want, &last); rec.err != nil {
					errs <- fmt.Errorf("%s: %v", c.name, rec.err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// fieldAsSpelled is h's field named exactly name (Peek would look for
// fasthttp's casing, Ratelimit-Policy).
func fieldAsSpelled(h *fasthttp.ResponseHeader, name string) string {
	for k, v := range h.All() {
		if string(k) == name {
			return string(v)
		}
	}
	return ""
}

// recorder keeps the first failure of require's checks made off the test's
// goroutine (t.FailNow must not be called there).
type recorder struct{ err error }

func (r *recorder) Errorf(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *recorder) FailNow() {}

// The 429 of one rule alone (denyOne, a copy of the rule's header with two
// values set) is, byte for byte, what deny's general path writes: status,
// every field in its order and casing, and the body; whatever the answer
// held before, whatever the rule and the decision, and after the policies
// were forgotten.
func TestDenyOneIsTheGeneralAnswer(t *testing.T) {
	rs := []*rules.CompiledRule{
		{ID: "per-ip", Algorithm: limit.FixedWindow, Limit: 3, Window: time.Minute},
		{ID: `odd "id" \ here`, Algorithm: limit.SlidingWindow, Limit: 1000, Window: time.Hour},
		{ID: "slots", Algorithm: limit.Concurrency, Limit: 8},
	}
	ds := []limiter.Decision{
		{Limit: 3},
		{Limit: 3, Remaining: 0, ResetAfter: 20 * time.Second, RetryAfter: 20 * time.Second},
		{Limit: 3, Remaining: 2, ResetAfter: 1500 * time.Millisecond, RetryAfter: 300 * time.Millisecond},
		{Limit: 1000, Remaining: -4, ResetAfter: 3 * time.Hour, RetryAfter: 59*time.Minute + time.Millisecond},
	}
	answer := func(ctx *fasthttp.RequestCtx) string {
		var lines []string
		for _, l := range strings.Split(ctx.Response.String(), "\r\n") {
			if !strings.HasPrefix(l, "Date: ") { // the server's clock, not the answer's
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\r\n")
	}
	dirty := func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("X-Before", "1")
		ctx.Response.Header.SetContentType("text/plain")
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		ctx.SetBodyString("before")
	}
	var last *policyEntry
	for _, forget := range []bool{false, true} {
		for _, r := range rs {
			for _, d := range ds {
				as := []applied{{rule: r, out: d}}
				var got, want fasthttp.RequestCtx
				dirty(&got)
				dirty(&want)
				deny(&got, as, false, &last)
				p := policyOf(r)
				problem.WriteBody(&want, fasthttp.StatusTooManyRequests, p.denied, seconds(max(d.RetryAfter, time.Second)))
				writeRateLimitFields(&want.Response.Header, as, false, p)
				require.Equal(t, answer(&want), answer(&got), "rule %q, %+v", r.ID, d)
				require.Contains(t, answer(&got), "\r\nRetry-After: ")
			}
			if forget {
				ForgetPolicies()
			}
		}
	}
}

// isRateLimitField picks the one name to compare by the field's length
// (and, at 17, its thirteenth byte): it must agree with a comparison with
// every name, over the names in any case, each one byte off in every
// position (to each neighbouring byte and to the byte only a careless case
// fold would take for it), one byte short or long, and the fields origins
// commonly send.
func TestIsRateLimitFieldAgreesWithTheNames(t *testing.T) {
	byName := func(k []byte) bool {
		for _, f := range rateLimitFields {
			if len(k) == len(f) && bytes.EqualFold(k, f) {
				return true
			}
		}
		return false
	}
	var corpus []string
	for _, f := range rateLimitFields {
		n := string(f)
		corpus = append(corpus, n, strings.ToLower(n), strings.ToUpper(n), n[:len(n)-1], n+"s", "x"+n)
		for i := range len(n) {
			for _, c := range []byte{n[i] - 1, n[i] + 1, n[i] ^ 0x20, n[i] &^ 0x20} {
				corpus = append(corpus, n[:i]+string([]byte{c})+n[i+1:])
			}
		}
	}
	corpus = append(corpus, "", "Date", "Server", "Content-Type", "Content-Length", "Cache-Control",
		"X-RateLimit-Lxxxx", "X-RateLimit-Rxxxx", "Transfer-Encoding", "X-Frame-Options", "Rate\rLimit")
	hits := 0
	for _, k := range corpus {
		want := byName([]byte(k))
		require.Equal(t, want, isRateLimitField([]byte(k)), "isRateLimitField(%q)", k)
		if want {
			hits++
		}
	}
	require.GreaterOrEqual(t, hits, 3*len(rateLimitFields))
}
