package edge

import (
	"context"
	"time"

	"github.com/edgeguard/edgeguard/internal/edge/build"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/hostroute"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// startConsul loads the first rules — from Consul, or from the cache when
// Consul is unreachable or holds an invalid document — and prepares the
// watches that Run starts.
func (e *Edge) startConsul(m consullink.Metrics) error {
	l, client, closeIdle, err := consullink.Open(e.cfg, consullink.Options{
		Public: e.Addr(), Admin: e.AdminAddr(), RLS: e.RLSAddr(), ConsulTickets: e.tls.Certificates().ConsulTickets(),
		StateDir: stateDir, Metrics: m, Parts: e.consulParts(), Log: e.log,
	})
	if err != nil {
		return err
	}
	e.closers = append(e.closers, closeIdle) // the agent's connections go with the edge
	e.consul = l

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stop, err := e.tls.StartConsul(ctx, client) // certificates, ticket keys, ACME
	if stop != nil {
		e.closers = append(e.closers, stop)
	}
	if err != nil {
		return err
	}
	// What the watches would read, before the first request: the
	// enforcement switch, the rate limit service's documents, the host
	// table and the rules,
	// each from the cache when Consul cannot give it.
	l.ReadEnforcement(ctx)
	if e.rls.FromConsul() {
		e.rls.ReadConsul(ctx, client, e.cfg.Region, e.rlsConsul())
	}
	e.router.ReadRegion(ctx, client, e.cfg.Region, e.hostsConsul())
	l.ReadRules(ctx)
	return nil
}

// consulParts are the edge's parts the Consul link reads and feeds.
func (e *Edge) consulParts() consullink.Parts {
	p := consullink.Parts{
		Rules:          e.rules.Load,
		CompileOptions: e.cfg.CompileOptions,
		ApplySnapshot:  e.rules.ApplySnapshot,
		ApplyRules:     e.rules.Apply,
		Enforcement:    func() string { en, _ := e.pipe.Enforcement(); return en.String() },
		SetEnforcement: e.pipe.SetEnforcement,
		UpdateShedder:  e.shed.Update,
		StartShedder:   func() error { return build.StartShedder(e.shed, e.cfg.Shedder, e.log) },
		ShedderVersion: func() string { return shedder.SettingsVersion(e.shed.Config()) },
		HostsVersion:   e.router.Version,
		SetEdges: func(inRegion, inPoP int) {
			e.nodesRegion.Store(int64(max(inRegion, 1)))
			e.nodesPoP.Store(int64(max(inPoP, 1)))
			e.shed.SetEdges(inRegion)
		},
		GlobalShare: func() []string { return e.global.Unreachable() },
	}
	if e.global != nil {
		p.Watches = append(p.Watches, e.global.Watch)
	}
	if e.rls.FromConsul() {
		p.Watches = append(p.Watches, e.rls.WatchConsul(e.cfg.Region, e.rlsConsul))
	}
	// The host table's version is registered too.
	p.Watches = append(p.Watches, e.router.WatchConsul(e.cfg.Region, e.cfg.PoP, e.hostsConsul, func() { e.consul.RulesChanged() }))
	p.Watches = append(p.Watches, e.tls.Certificates().ConsulWatches(e.cfg.Region)...)
	return p
}

// hostsConsul is what the host table needs of the Consul link (package
// hostroute): its missing document, and the cache beside the rules cache.
func (e *Edge) hostsConsul() hostroute.Consul {
	return hostroute.Consul{
		Missing:   func(missing bool) bool { return e.consul.SetMissing(consullink.DocHosts, missing) },
		Cache:     e.consul.Beside(".hosts.yaml"),
		WriteFile: consullink.WriteFileAtomic,
	}
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

// stateDir is the system-wide state directory tried after $STATE_DIRECTORY.
var stateDir = "/var/lib/edgeguard"
