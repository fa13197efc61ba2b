package admin

import (
	"fmt"
	"net/http"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Readiness is what /readyz answers, for DNS health checks and load
// balancers: 503 when this node should get no traffic (draining, no rules,
// or a fail-closed store that cannot decide), 200 otherwise — with a body
// that says "degraded" and why while the store fails and the fail mode
// still serves (the fallback enforces limit/N per node), and which
// documents Consul lost while the edge keeps its last good ones
// (missing.go).
//
// Each input is read when asked, in this order.
type Readiness struct {
	Draining    func() bool
	RulesLoaded func() bool
	Health      func() limiter.Health
	Store       string        // the store's name (redis, memory)
	Missing     func() string // the documents Consul lost; "" when none
	Serving     func() bool   // the public server has started (the ready gauge only)
}

// Value is the ready gauge: 1 when /readyz answers 200 and the public
// server has started, 0 otherwise.
func (r Readiness) Value() float64 {
	if code, _ := r.Answer(); code == http.StatusOK && r.Serving() {
		return 1
	}
	return 0
}

// Answer is the status and body of /readyz.
func (r Readiness) Answer() (int, string) {
	code, body := r.answer()
	if d := r.Missing(); d != "" && code == http.StatusOK {
		body += "; " + d
	}
	return code, body
}

func (r Readiness) answer() (int, string) {
	if r.Draining() {
		return http.StatusServiceUnavailable, "draining"
	}
	if !r.RulesLoaded() {
		return http.StatusServiceUnavailable, "no rules loaded"
	}
	h := r.Health()
	switch h.State {
	case limiter.Degraded:
		return http.StatusOK, "degraded: " + describeHealth(h, r.Store)
	case limiter.Unavailable:
		return http.StatusServiceUnavailable, "unavailable: " + describeHealth(h, r.Store)
	}
	return http.StatusOK, "ready"
}

var healthWhy = map[string]string{
	limiter.ReasonTimeout:     "does not answer within --redis-timeout",
	limiter.ReasonUnreachable: "is unreachable",
	limiter.ReasonCredentials: "rejects our credentials (fix the --redis URL or the ACL)",
	limiter.ReasonError:       "answers with errors",
}

var failModeDoes = map[limiter.FailMode]string{
	limiter.FailFallback: "checks are decided locally, limit/N per node",
	limiter.FailOpen:     "checks are not enforced (fail-mode open)",
	limiter.FailClosed:   "checks are refused with 503 (fail-mode closed)",
}

// describeHealth is one line: reason=<class>, what it means, since when,
// what the fail mode does, and the last error.
func describeHealth(h limiter.Health, store string) string {
	s := fmt.Sprintf("reason=%s: %s store %s", h.Reason, store, healthWhy[h.Reason])
	if !h.Since.IsZero() {
		s += fmt.Sprintf(" since %s (%s)", h.Since.UTC().Format(time.RFC3339), time.Since(h.Since).Round(time.Second))
	}
	if h.OpenShards > 0 {
		s += fmt.Sprintf("; %d shard(s) with an open breaker", h.OpenShards)
	}
	s += "; " + failModeDoes[h.FailMode]
	if h.Detail != "" {
		s += "; last error: " + h.Detail
	}
	return s
}
