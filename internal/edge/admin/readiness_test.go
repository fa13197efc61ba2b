package admin

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func TestReadinessAnswer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		draining bool
		rules    bool
		health   limiter.Health
		missing  string
		code     int
		body     string
	}{
		{"ready", false, true, limiter.Health{State: limiter.Healthy}, "", http.StatusOK, "ready"},
		{"draining first", true, false, limiter.Health{State: limiter.Unavailable}, "", http.StatusServiceUnavailable, "draining"},
		{"no rules", false, false, limiter.Health{State: limiter.Healthy}, "", http.StatusServiceUnavailable, "no rules loaded"},
		{"missing documents on a ready edge", false, true, limiter.Health{State: limiter.Healthy}, "missing: rules", http.StatusOK, "ready; missing: rules"},
		{"missing documents say nothing on a 503", true, true, limiter.Health{}, "missing: rules", http.StatusServiceUnavailable, "draining"},
		{"degraded", false, true, limiter.Health{State: limiter.Degraded, Reason: limiter.ReasonTimeout, FailMode: limiter.FailFallback}, "", http.StatusOK,
			"degraded: reason=timeout: redis store does not answer within --redis-timeout; checks are decided locally, limit/N per node"},
		{"unavailable", false, true, limiter.Health{State: limiter.Unavailable, Reason: limiter.ReasonUnreachable, FailMode: limiter.FailClosed}, "", http.StatusServiceUnavailable,
			"unavailable: reason=unreachable: redis store is unreachable; checks are refused with 503 (fail-mode closed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Readiness{
				Draining:    func() bool { return tc.draining },
				RulesLoaded: func() bool { return tc.rules },
				Health:      func() limiter.Health { return tc.health },
				Store:       "redis",
				Missing:     func() string { return tc.missing },
			}
			code, body := r.Answer()
			require.Equal(t, tc.code, code)
			require.Equal(t, tc.body, body)
			// The ready gauge: 1 only for a 200 once the public server serves.
			r.Serving = func() bool { return false }
			require.Zero(t, r.Value(), "before the public server serves")
			r.Serving = func() bool { return true }
			want := 0.0
			if tc.code == http.StatusOK {
				want = 1
			}
			require.Equal(t, want, r.Value())
		})
	}
}
