package shedder

import (
	"fmt"
	"strings"
)

// Classifier assigns a Tier to a request from plain values, so the edge can
// feed it from fasthttp without this package importing an HTTP library. It
// is immutable and safe for concurrent use.
type Classifier struct {
	priorityHeader string
	testModeHeader string
	apiKeyHeader   string
	paths          []PrefixRule
	apiKeys        []PrefixRule
	readMethods    []string
}

// NewClassifier builds a Classifier; it rejects what Config.Validate would.
func NewClassifier(cfg TierConfig) (*Classifier, error) {
	probe := DefaultConfig()
	probe.Tiers = cfg
	if err := probe.Validate(); err != nil {
		return nil, fmt.Errorf("shedder: classifier: %w", err)
	}
	c := probe.Clone().Tiers
	return &Classifier{
		priorityHeader: c.PriorityHeader,
		testModeHeader: c.TestModeHeader,
		apiKeyHeader:   c.APIKeyHeader,
		paths:          c.Paths,
		apiKeys:        c.APIKeys,
		readMethods:    c.ReadMethods,
	}, nil
}

// Classify returns the request's tier. header looks a header up by name
// (case-insensitively, as fasthttp's Peek does) and reports whether it is
// present. trusted says the request came from a proxy allowed to set the
// priority and test-mode headers and to match trusted_only path rules;
// from anyone else those are ignored, and an untrusted request is never
// critical, whatever the settings say. path should be the path without
// query, though a query is tolerated.
//
// Order: trusted test-mode header, trusted priority header, path prefix,
// API-key prefix, method. Test mode comes first because synthetic traffic
// must stay sheddable whatever priority it claims.
func (c *Classifier) Classify(method, path string, header func(string) (string, bool), trusted bool) Tier {
	if trusted && header != nil {
		if c.testModeHeader != "" {
			if v, ok := header(c.testModeHeader); ok && truthy(v) {
				return TierTest
			}
		}
		if c.priorityHeader != "" {
			if v, ok := header(c.priorityHeader); ok {
				if t, ok := lookupTier(v); ok {
					return t
				}
			}
		}
	}
	for _, r := range c.paths {
		if (trusted || !r.TrustedOnly && r.Tier != TierCritical) && pathHasPrefix(path, r.Prefix) {
			return r.Tier
		}
	}
	if c.apiKeyHeader != "" && len(c.apiKeys) > 0 && header != nil {
		if key, ok := header(c.apiKeyHeader); ok {
			key = stripBearer(strings.TrimSpace(key))
			for _, r := range c.apiKeys {
				if r.Tier != TierCritical && strings.HasPrefix(key, r.Prefix) {
					return r.Tier
				}
			}
		}
	}
	for _, m := range c.readMethods {
		if method == m {
			return TierRead
		}
	}
	return TierWrite
}

// TrustedHeaders names the request fields only a trusted peer may set: the
// priority and test-mode headers (empty when switched off). The edge
// removes them from anyone else's requests, so an origin, or another edge
// that trusts this one, never takes a client's own claim for this edge's.
func (c *Classifier) TrustedHeaders() (priority, testMode string) {
	return c.priorityHeader, c.testModeHeader
}

// lookupTier is ParseTier without building an error for junk header
// values, which arrive per request.
func lookupTier(v string) (Tier, bool) {
	v = strings.TrimSpace(v)
	for i, name := range tierNames {
		if strings.EqualFold(v, name) {
			return Tier(i), true
		}
	}
	return TierNone, false
}

func truthy(v string) bool {
	v = strings.TrimSpace(v)
	return v == "1" || strings.EqualFold(v, "true") || strings.EqualFold(v, "yes") || strings.EqualFold(v, "on")
}

// pathHasPrefix matches whole segments so "/healthcheck" cannot be reached
// as critical through "/healthcheck-anything".
func pathHasPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	if len(path) == len(prefix) || strings.HasSuffix(prefix, "/") {
		return true
	}
	switch path[len(prefix)] {
	case '/', '?':
		return true
	}
	return false
}

func stripBearer(v string) string {
	const p = "bearer "
	if len(v) > len(p) && strings.EqualFold(v[:len(p)], p) {
		return strings.TrimSpace(v[len(p):])
	}
	return v
}
