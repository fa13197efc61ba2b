package config

import (
	"errors"
	"fmt"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// CompileOptions are how these settings compile rules: client keys by
// --ipv6-prefix, descriptor values salted with the key salt.
func (c Config) CompileOptions() []rules.CompileOption {
	return []rules.CompileOption{rules.WithIPv6Prefix(c.IPv6Prefix), rules.WithKeySalt([]byte(c.KeySalt))}
}

// CheckRules refuses rules that these settings would break: a held unit
// (a concurrency slot, given back once the origin's response header is in)
// must outlive the longest wait for that header, or a slot held by a
// request still waiting on the origin would expire and admit one too many.
func (c Config) CheckRules(snap *rules.Snapshot) error {
	var errs []error
	for _, r := range snap.Rules() {
		if r.Algorithm.Spec().Held && r.Window <= c.OriginHeaderTimeout {
			errs = append(errs, fmt.Errorf("rule %q: window: a concurrency slot's TTL (%s) must exceed --origin-header-timeout (%s)", r.ID, r.Window, c.OriginHeaderTimeout))
		}
	}
	return errors.Join(errs...)
}
