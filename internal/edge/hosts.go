package edge

import (
	"context"
	"errors"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/hostroute"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// buildRouter puts the host table in front of the default pool: from
// --hosts, or (with --consul) from the region's hosts document, watched.
func (e *Edge) buildRouter(reg prometheus.Registerer) error {
	sem, err := pathsem.Parse(e.cfg.PathSemantics) // valid: config.Validate
	if err != nil {
		return err
	}
	paths := hosts.PathPolicy{Semantics: sem, RefuseAmbiguous: e.cfg.RefuseAmbiguousPaths}
	if e.router, err = hostroute.New(e.proxy, e.originBase, paths, e.originMetrics, reg, e.log); err != nil {
		return err
	}
	e.closers = append(e.closers, e.router.Close)
	if e.cfg.Hosts != "" {
		return e.loadHosts()
	}
	return nil
}

// loadHosts reads and applies --hosts; on any error the table in force stays.
func (e *Edge) loadHosts() error { return e.router.LoadFile(e.cfg.Hosts) }

// applyConsulHosts applies the region's hosts document as Consul gives it
// (nil: absent). An absent document, once there was one, is missing: the
// table in force stays (a cleared table is an explicit empty document). An
// invalid one is refused and logged; the table in force stays. A good one
// is kept on disk for a restart without Consul, unless it is the PoP's
// canary (canary: a candidate, not the region's table).
func (e *Edge) applyConsulHosts(doc []byte, canary bool) {
	if doc == nil {
		if e.router.Version() != "" && e.consul.SetMissing(consullink.DocHosts, true) {
			e.log.Warn("host table missing in consul; keeping the table in force", "version", e.router.Version())
		}
		return
	}
	if err := e.applyHostsDoc(doc); err != nil {
		e.log.Error("host table from consul refused; keeping the table in force", "err", err, "version", e.router.Version())
		return
	}
	e.consul.SetMissing(consullink.DocHosts, false)
	if canary {
		return // a candidate is never what a restart runs without Consul
	}
	if path := e.hostsCache(); path != "" {
		if err := consullink.WriteFileAtomic(path, doc); err != nil {
			e.log.Warn("could not cache the host table", "path", path, "err", err)
		}
	}
}

func (e *Edge) applyHostsDoc(doc []byte) error { return e.router.Load(doc) }

// hostsCache is where the last good hosts document from Consul is kept.
func (e *Edge) hostsCache() string { return e.consul.Beside(".hosts.yaml") }

// readConsulHosts applies the region's hosts document before the first
// request, or the cached one when Consul cannot give it.
func (e *Edge) readConsulHosts(ctx context.Context, client *region.Client) {
	doc, _, err := client.Hosts(ctx, e.cfg.Region)
	if err == nil {
		e.applyConsulHosts(doc, false)
		return
	}
	path := e.hostsCache()
	if path == "" {
		e.log.Warn("no host table from consul and no cache: every host goes to the default pool until consul answers", "err", err)
		return
	}
	cached, cerr := os.ReadFile(path)
	switch {
	case errors.Is(cerr, os.ErrNotExist):
		// No table cached: the region has none, or this edge never ran.
	case cerr == nil && len(cached) > 0:
		if cerr = e.applyHostsDoc(cached); cerr == nil {
			e.log.Warn("host table from the cache: consul did not answer", "err", err, "version", e.router.Version())
			return
		}
		fallthrough
	default:
		e.log.Warn("no host table from consul nor from the cache: every host goes to the default pool until consul answers", "err", err, "cache", path, "cache_err", cerr)
	}
}
