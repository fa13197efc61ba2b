package edge

import (
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
)

// buildRLS builds the rate limit service, when --rls-listen is set
// (package rlslink).
func (e *Edge) buildRLS(reg prometheus.Registerer) error {
	s, err := rlslink.New(e.cfg.RLS, rlslink.Options{
		Limiter:      e.store.Limiter,
		Nodes:        func() int { return int(e.nodesRegion.Load()) },
		KeySalt:      e.cfg.KeySalt,
		IPv6Prefix:   e.cfg.IPv6Prefix,
		ConsulPrefix: e.cfg.ConsulPrefix,
		Region:       e.cfg.Region,
		Log:          e.log,
		Bind:         func(addr string) (net.Listener, error) { return e.sockets.Bind(handoff.RLS, addr) },
	}, reg)
	if err != nil || s == nil {
		return err
	}
	e.closers = append(e.closers, s.Close)
	e.rls = s
	return nil
}

// rlsConsul is what the rate limit service needs of the Consul link
// (package rlslink): its missing document, registration, and the cache
// beside the rules cache.
func (e *Edge) rlsConsul() rlslink.Consul {
	return rlslink.Consul{
		Missing:   func(missing bool) bool { return e.consul.SetMissing(consullink.DocRLS, missing) },
		Changed:   e.consul.RulesChanged,
		Cache:     e.consul.Beside(".rls.json"),
		WriteFile: consullink.WriteFileAtomic,
		Draining:  e.draining.Load,
	}
}
