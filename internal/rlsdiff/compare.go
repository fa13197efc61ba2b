package rlsdiff

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An Answer is what one service said to one call: a response, or a gRPC
// error.
type Answer struct {
	Resp *pb.RateLimitResponse
	Err  error
}

// Code is the gRPC status code of the answer (OK for a response).
func (a Answer) Code() codes.Code { return status.Code(a.Err) }

func (a Answer) String() string {
	if a.Err != nil {
		return fmt.Sprintf("error %s: %q", a.Code(), status.Convert(a.Err).Message())
	}
	var b strings.Builder
	b.WriteString(a.Resp.GetOverallCode().String())
	for _, s := range a.Resp.GetStatuses() {
		fmt.Fprintf(&b, " [%s", s.GetCode())
		if l := s.GetCurrentLimit(); l != nil {
			fmt.Fprintf(&b, " %d/%s", l.GetRequestsPerUnit(), l.GetUnit())
			if l.GetName() != "" {
				fmt.Fprintf(&b, " %q", l.GetName())
			}
		}
		fmt.Fprintf(&b, " remaining %d", s.GetLimitRemaining())
		if s.GetDurationUntilReset() != nil {
			fmt.Fprintf(&b, " reset %s", s.GetDurationUntilReset().AsDuration())
		}
		b.WriteString("]")
	}
	if h := headers(a.Resp.GetResponseHeadersToAdd()); h != "" {
		b.WriteString(" response headers " + h)
	}
	if h := headers(a.Resp.GetRequestHeadersToAdd()); h != "" {
		b.WriteString(" request headers " + h)
	}
	return b.String()
}

func headers(hs []*corev3.HeaderValue) string {
	var kv []string
	for _, h := range hs {
		kv = append(kv, strings.ToLower(h.GetKey())+": "+h.GetValue())
	}
	sort.Strings(kv)
	return strings.Join(kv, ", ")
}

// A Diff is one field in which the two answers differ.
type Diff struct {
	// Field is "error" (one answered an error, or both with other
	// codes), "overall_code", "statuses" (their number),
	// "status.code", "status.current_limit", "status.limit_remaining",
	// "status.duration_until_reset", "response_headers" or
	// "request_headers".
	Field string
	// Index is the descriptor's for the status fields.
	Index int
}

func (d Diff) String() string {
	if strings.HasPrefix(d.Field, "status.") {
		return fmt.Sprintf("status[%d].%s", d.Index, strings.TrimPrefix(d.Field, "status."))
	}
	return d.Field
}

// ResetTolerance is how far the two durations until reset may be apart:
// the two calls are sent together, but not in the same instant.
const ResetTolerance = 2 * time.Second

// Compare lists the fields in which a and b differ.
func Compare(a, b Answer) []Diff {
	if a.Err != nil || b.Err != nil {
		if a.Code() != b.Code() {
			return []Diff{{Field: "error"}}
		}
		return nil
	}
	var ds []Diff
	ra, rb := a.Resp, b.Resp
	if ra.GetOverallCode() != rb.GetOverallCode() {
		ds = append(ds, Diff{Field: "overall_code"})
	}
	sa, sb := ra.GetStatuses(), rb.GetStatuses()
	if len(sa) != len(sb) {
		ds = append(ds, Diff{Field: "statuses"})
	}
	for i := 0; i < len(sa) && i < len(sb); i++ {
		x, y := sa[i], sb[i]
		if x.GetCode() != y.GetCode() {
			ds = append(ds, Diff{Field: "status.code", Index: i})
		}
		lx, ly := x.GetCurrentLimit(), y.GetCurrentLimit()
		if (lx == nil) != (ly == nil) || lx.GetRequestsPerUnit() != ly.GetRequestsPerUnit() || lx.GetUnit() != ly.GetUnit() || lx.GetName() != ly.GetName() {
			ds = append(ds, Diff{Field: "status.current_limit", Index: i})
		}
		if x.GetLimitRemaining() != y.GetLimitRemaining() {
			ds = append(ds, Diff{Field: "status.limit_remaining", Index: i})
		}
		dx, dy := x.GetDurationUntilReset(), y.GetDurationUntilReset()
		if (dx == nil) != (dy == nil) || (dx.AsDuration()-dy.AsDuration()).Abs() > ResetTolerance {
			ds = append(ds, Diff{Field: "status.duration_until_reset", Index: i})
		}
	}
	if !sameHeaders(ra.GetResponseHeadersToAdd(), rb.GetResponseHeadersToAdd()) {
		ds = append(ds, Diff{Field: "response_headers"})
	}
	if !sameHeaders(ra.GetRequestHeadersToAdd(), rb.GetRequestHeadersToAdd()) {
		ds = append(ds, Diff{Field: "request_headers"})
	}
	return ds
}

// sameHeaders compares header fields by name (any case) and value; a
// value that is a number of seconds (RateLimit-Reset) may be
// ResetTolerance apart.
func sameHeaders(a, b []*corev3.HeaderValue) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]string{}
	for _, h := range a {
		m[strings.ToLower(h.GetKey())] = h.GetValue()
	}
	for _, h := range b {
		v, ok := m[strings.ToLower(h.GetKey())]
		if !ok {
			return false
		}
		if v == h.GetValue() {
			continue
		}
		if !strings.Contains(strings.ToLower(h.GetKey()), "reset") {
			return false
		}
		var x, y int64
		if _, err := fmt.Sscan(v, &x); err != nil {
			return false
		}
		if _, err := fmt.Sscan(h.GetValue(), &y); err != nil {
			return false
		}
		if d := x - y; d > int64(ResetTolerance/time.Second) || d < -int64(ResetTolerance/time.Second) {
			return false
		}
	}
	return true
}
