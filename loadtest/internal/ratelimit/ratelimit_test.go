package ratelimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name       string
		header     map[string]string
		policies   []Policy
		limits     []Limit
		retryAfter time.Duration
		hasRetry   bool
		malformed  []string // fields reported malformed, in order
	}{
		{
			name: "one rule, canonicalized names as k6 gives them",
			header: map[string]string{
				"Ratelimit-Policy": `"per-ip";q=100;w=60`,
				"Ratelimit":        `"per-ip";r=37;t=12`,
			},
			policies: []Policy{{Name: "per-ip", Quota: 100, Window: 60}},
			limits:   []Limit{{Name: "per-ip", Remaining: 37, Reset: 12}},
		},
		{
			name: "several rules joined from several lines, unit, concurrency without w",
			header: map[string]string{
				"RateLimit-Policy": `"per-ip";q=10;w=10, "uploads";q=4, "bytes";q=1000;w=1;qu="content-bytes"`,
				"RateLimit":        `"per-ip";r=0;t=3, "uploads";r=4`,
				"Retry-After":      "3",
			},
			policies: []Policy{
				{Name: "per-ip", Quota: 10, Window: 10},
				{Name: "uploads", Quota: 4},
				{Name: "bytes", Quota: 1000, Window: 1, Unit: "content-bytes"},
			},
			limits:     []Limit{{Name: "per-ip", Remaining: 0, Reset: 3}, {Name: "uploads", Remaining: 4}},
			retryAfter: 3 * time.Second,
			hasRetry:   true,
		},
		{
			name:       "Retry-After as an HTTP-date",
			header:     map[string]string{"Retry-After": "Fri, 02 Jan 2026 03:04:15 GMT"},
			retryAfter: 10 * time.Second,
			hasRetry:   true,
		},
		{
			name:     "no fields at all",
			header:   map[string]string{"Content-Type": "text/plain"},
			policies: nil,
		},
		{
			name: "garbage list, token name, negative and fractional parameters, missing q",
			header: map[string]string{
				"RateLimit-Policy": `per-ip;q=10;w=10, "ok";q=5;w=1, "neg";q=-1, "frac";q=1.5, "noq";w=3`,
				"RateLimit":        `"per-ip";r=?1;t=`,
				"Retry-After":      "soon",
			},
			policies:  []Policy{{Name: "ok", Quota: 5, Window: 1}},
			malformed: []string{FieldPolicy, FieldPolicy, FieldPolicy, FieldPolicy, FieldRateLimit, FieldRetryAfter},
		},
		{
			name:      "inner list member",
			header:    map[string]string{"RateLimit": `("a" "b");r=1`},
			malformed: []string{FieldRateLimit},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := Parse(FromMap(tc.header), now)
			require.Equal(t, tc.policies, f.Policies)
			require.Equal(t, tc.limits, f.Limits)
			require.Equal(t, tc.hasRetry, f.HasRetryAfter)
			require.Equal(t, tc.retryAfter, f.RetryAfter)
			var got []string
			for _, m := range f.Malformed {
				require.NotEmpty(t, m.Reason)
				got = append(got, m.Field)
			}
			require.Equal(t, tc.malformed, got, "%+v", f.Malformed)
		})
	}
}

func TestFromHTTPKeepsEveryLine(t *testing.T) {
	h := http.Header{}
	h.Add("RateLimit-Policy", `"a";q=1;w=1`)
	h.Add("RateLimit-Policy", `"b";q=2;w=2`)
	f := Parse(FromHTTP(h), time.Now())
	require.Empty(t, f.Malformed)
	require.Equal(t, []Policy{{Name: "a", Quota: 1, Window: 1}, {Name: "b", Quota: 2, Window: 2}}, f.Policies)
	p, ok := f.Policy("b")
	require.True(t, ok)
	require.Equal(t, int64(2), p.Quota)
	_, ok = f.Limit("b")
	require.False(t, ok)
}
