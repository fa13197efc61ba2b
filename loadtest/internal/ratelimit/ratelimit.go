// Package ratelimit reads the rate-limit fields of an HTTP response: the
// IETF httpapi-ratelimit-headers draft's RateLimit-Policy and RateLimit
// (Structured Field lists, parsed with httpsfv) and Retry-After.
//
// Nothing is dropped silently: every field or item that does not parse is
// reported in Fields.Malformed with the field's name and the reason, so a
// load test can count them.
package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// Field names, as the draft spells them.
const (
	FieldPolicy     = "RateLimit-Policy"
	FieldRateLimit  = "RateLimit"
	FieldRetryAfter = "Retry-After"
)

// Policy is one RateLimit-Policy item: `"per-ip";q=100;w=60`.
type Policy struct {
	Name string `json:"name"`
	// Quota is q; Window is w in seconds (0 when absent, as for concurrency
	// limits); Unit is qu when the quota is not counted in requests.
	Quota  int64  `json:"q"`
	Window int64  `json:"w"`
	Unit   string `json:"qu,omitempty"`
}

// Limit is one RateLimit item: `"per-ip";r=37;t=12`.
type Limit struct {
	Name      string `json:"name"`
	Remaining int64  `json:"r"`
	Reset     int64  `json:"t"`
}

// Malformed is one field (or one item of it) that could not be read.
type Malformed struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

// Fields are the rate-limit fields of one response.
type Fields struct {
	Policies []Policy `json:"policies"`
	Limits   []Limit  `json:"limits"`
	// RetryAfter is the Retry-After delay; HasRetryAfter tells an absent
	// field from "0".
	RetryAfter    time.Duration `json:"-"`
	HasRetryAfter bool          `json:"-"`
	Malformed     []Malformed   `json:"malformed,omitempty"`
}

// Policy returns the named RateLimit-Policy item.
func (f *Fields) Policy(name string) (Policy, bool) {
	for _, p := range f.Policies {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// Limit returns the named RateLimit item.
func (f *Fields) Limit(name string) (Limit, bool) {
	for _, l := range f.Limits {
		if l.Name == name {
			return l, true
		}
	}
	return Limit{}, false
}

// Header looks a field up by name, ignoring case (k6 hands scripts
// canonicalized names such as "Ratelimit-Policy"). Several lines of one
// field are returned in order.
type Header func(name string) []string

// FromMap adapts a map of field name to value (k6's response.headers, where
// repeated lines are already joined with ", ") to a Header.
func FromMap(m map[string]string) Header {
	return func(name string) []string {
		for k, v := range m {
			if strings.EqualFold(k, name) {
				return []string{v}
			}
		}
		return nil
	}
}

// FromHTTP adapts a net/http header.
func FromHTTP(h http.Header) Header {
	return func(name string) []string { return h.Values(name) }
}

// Parse reads the rate-limit fields. now resolves an HTTP-date Retry-After.
func Parse(h Header, now time.Time) Fields {
	var f Fields
	if v := h(FieldPolicy); len(v) > 0 {
		f.Policies = parsePolicies(v, &f.Malformed)
	}
	if v := h(FieldRateLimit); len(v) > 0 {
		f.Limits = parseLimits(v, &f.Malformed)
	}
	if v := h(FieldRetryAfter); len(v) > 0 {
		d, err := parseRetryAfter(v, now)
		if err != nil {
			f.Malformed = append(f.Malformed, Malformed{Field: FieldRetryAfter, Reason: err.Error()})
		} else {
			f.RetryAfter, f.HasRetryAfter = d, true
		}
	}
	return f
}

func parsePolicies(v []string, bad *[]Malformed) []Policy {
	var out []Policy
	eachItem(FieldPolicy, v, bad, func(name string, p *httpsfv.Params) error {
		pol := Policy{Name: name}
		var err error
		if pol.Quota, err = intParam(p, "q", true); err != nil {
			return err
		}
		if pol.Window, err = intParam(p, "w", false); err != nil {
			return err
		}
		if u, ok := p.Get("qu"); ok {
			s, isStr := u.(string)
			if !isStr {
				return fmt.Errorf("qu is %T, want a string", u)
			}
			pol.Unit = s
		}
		out = append(out, pol)
		return nil
	})
	return out
}

func parseLimits(v []string, bad *[]Malformed) []Limit {
	var out []Limit
	eachItem(FieldRateLimit, v, bad, func(name string, p *httpsfv.Params) error {
		l := Limit{Name: name}
		var err error
		if l.Remaining, err = intParam(p, "r", true); err != nil {
			return err
		}
		if l.Reset, err = intParam(p, "t", false); err != nil {
			return err
		}
		out = append(out, l)
		return nil
	})
	return out
}

// eachItem parses a Structured Field list whose members are String items
// (the policy names) and hands each one's parameters to fn.
func eachItem(field string, v []string, bad *[]Malformed, fn func(string, *httpsfv.Params) error) {
	list, err := httpsfv.UnmarshalList(v)
	if err != nil {
		*bad = append(*bad, Malformed{Field: field, Reason: "not a structured field list: " + err.Error()})
		return
	}
	for i, m := range list {
		item, ok := m.(httpsfv.Item)
		if !ok {
			*bad = append(*bad, Malformed{Field: field, Reason: fmt.Sprintf("member %d is an inner list", i)})
			continue
		}
		name, ok := item.Value.(string)
		if !ok || name == "" {
			*bad = append(*bad, Malformed{Field: field, Reason: fmt.Sprintf("member %d: name is %T %v, want a non-empty string", i, item.Value, item.Value)})
			continue
		}
		if err := fn(name, item.Params); err != nil {
			*bad = append(*bad, Malformed{Field: field, Reason: fmt.Sprintf("%q: %v", name, err)})
		}
	}
}

// intParam reads a non-negative integer parameter.
func intParam(p *httpsfv.Params, key string, required bool) (int64, error) {
	v, ok := p.Get(key)
	if !ok {
		if required {
			return 0, fmt.Errorf("%s missing", key)
		}
		return 0, nil
	}
	n, isInt := v.(int64)
	if !isInt {
		return 0, fmt.Errorf("%s is %T %v, want an integer", key, v, v)
	}
	if n < 0 {
		return 0, fmt.Errorf("%s is negative (%d)", key, n)
	}
	return n, nil
}

// parseRetryAfter reads delta-seconds or an HTTP-date (RFC 9110 §10.2.3).
func parseRetryAfter(v []string, now time.Time) (time.Duration, error) {
	if len(v) != 1 {
		return 0, fmt.Errorf("%d values, want one", len(v))
	}
	s := strings.TrimSpace(v[0])
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	t, err := http.ParseTime(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither delay-seconds nor an HTTP-date", s)
	}
	if d := t.Sub(now); d > 0 {
		return d, nil
	}
	return 0, nil
}
