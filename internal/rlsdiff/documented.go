package rlsdiff

import (
	"fmt"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
)

// A Difference is one way the edge answers otherwise than the reference
// on purpose. Each is named in docs/envoy.md ("What differs, on
// purpose"); Doc is the words it is named by there, which
// TestDocumentedInEnvoyMD looks for.
type Difference struct {
	ID     string
	Reason string
	Doc    string
	// Match says whether the difference d between ref's and edge's
	// answers to c, in set s, is this one.
	Match func(s Set, c *Case, ref, edge Answer, d Diff, h *History) bool
}

// History is what the run saw of a set before the case at hand.
type History struct {
	// denied holds the limits (domain and current_limit) the reference
	// answered OVER_LIMIT or 0 remaining for: it counts the hits past the
	// limit, so its counter of that limit may be past the edge's from then
	// on.
	denied map[string]bool
}

func limitKey(domain string, st *pb.RateLimitResponse_DescriptorStatus) string {
	l := st.GetCurrentLimit()
	return fmt.Sprintf("%s|%d|%s|%s", domain, l.GetRequestsPerUnit(), l.GetUnit(), l.GetName())
}

// saw records the reference's answer to c.
func (h *History) saw(c *Case, ref Answer) {
	if h.denied == nil {
		h.denied = map[string]bool{}
	}
	for _, st := range ref.Resp.GetStatuses() {
		// A shadow limit answers OK past its limit, with 0 remaining.
		if (st.GetCode() == pb.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() == 0) && st.GetCurrentLimit() != nil {
			h.denied[limitKey(c.Req.GetDomain(), st)] = true
		}
	}
}

// statuses returns the i-th status of both answers, nil when either has none.
func statuses(ref, edge Answer, i int) (r, e *pb.RateLimitResponse_DescriptorStatus) {
	rs, es := ref.Resp.GetStatuses(), edge.Resp.GetStatuses()
	if i >= len(rs) || i >= len(es) {
		return nil, nil
	}
	return rs[i], es[i]
}

// deniedCounted: after the reference denied hits of a limit (and counted
// them), the edge, which did not count them, has as much left or more.
func deniedCounted(c *Case, ref, edge Answer, i int, h *History) bool {
	r, e := statuses(ref, edge, i)
	if r == nil || r.GetCurrentLimit() == nil || !h.denied[limitKey(c.Req.GetDomain(), r)] {
		return false
	}
	return e.GetLimitRemaining() >= r.GetLimitRemaining() &&
		!(e.GetCode() == pb.RateLimitResponse_OVER_LIMIT && r.GetCode() == pb.RateLimitResponse_OK)
}

// lookAtLimit: a look (a descriptor's own hits_addend 0) when no hit is
// left: the edge answers OVER_LIMIT, the reference OK with 0 remaining.
func lookAtLimit(c *Case, ref, edge Answer, i int) bool {
	r, e := statuses(ref, edge, i)
	ds := c.Req.GetDescriptors()
	if r == nil || i >= len(ds) || ds[i].GetHitsAddend() == nil || ds[i].GetHitsAddend().GetValue() != 0 {
		return false
	}
	return e.GetCode() == pb.RateLimitResponse_OVER_LIMIT && r.GetCode() == pb.RateLimitResponse_OK && e.GetLimitRemaining() == 0
}

// anyStatus says whether pred holds for a status where the two answers
// differ (the overall code and the header fields follow from them).
func anyStatus(ref, edge Answer, pred func(i int) bool) bool {
	for i := range ref.Resp.GetStatuses() {
		r, e := statuses(ref, edge, i)
		if r != nil && (r.GetCode() != e.GetCode() || r.GetLimitRemaining() != e.GetLimitRemaining()) && pred(i) {
			return true
		}
	}
	return false
}

func statusField(d Diff) bool { return strings.HasPrefix(d.Field, "status.") }

// Documented is the list a run judges its differences by.
var Documented = []Difference{
	{
		ID:     "invalid-argument",
		Reason: "an empty domain or descriptor list is INVALID_ARGUMENT; the reference answers an untyped error (UNKNOWN)",
		Doc:    "an empty domain or descriptor list is `INVALID_ARGUMENT`",
		Match: func(_ Set, c *Case, ref, edge Answer, d Diff, _ *History) bool {
			return d.Field == "error" && edge.Code() == codes.InvalidArgument && (c.Req.GetDomain() == "" || len(c.Req.GetDescriptors()) == 0)
		},
	},
	{
		ID:     "denied-hit-not-counted",
		Reason: "a denied hit is not counted (the reference counts the hit that takes a limit over, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT or not), so after a denial the edge has as much left or more",
		Doc:    "A denied hit is not counted",
		Match: func(_ Set, c *Case, ref, edge Answer, d Diff, h *History) bool {
			switch {
			case statusField(d):
				return deniedCounted(c, ref, edge, d.Index, h)
			case d.Field == "overall_code", d.Field == "response_headers":
				return anyStatus(ref, edge, func(i int) bool { return deniedCounted(c, ref, edge, i, h) })
			}
			return false
		},
	},
	{
		ID:     "look-at-limit",
		Reason: "a look (own hits_addend 0) answers OVER_LIMIT once one more hit would not fit; the reference answers OK with 0 remaining",
		Doc:    "answers OVER_LIMIT as soon as one more hit",
		Match: func(_ Set, c *Case, ref, edge Answer, d Diff, _ *History) bool {
			switch {
			case d.Field == "status.code":
				return lookAtLimit(c, ref, edge, d.Index)
			case d.Field == "overall_code", d.Field == "response_headers":
				return anyStatus(ref, edge, func(i int) bool { return lookAtLimit(c, ref, edge, i) })
			}
			return false
		},
	},
}

// documented names the Difference that explains d, or "".
func documented(s Set, c *Case, ref, edge Answer, d Diff, h *History) string {
	for _, x := range Documented {
		if x.Match(s, c, ref, edge, d, h) {
			return x.ID
		}
	}
	return ""
}
