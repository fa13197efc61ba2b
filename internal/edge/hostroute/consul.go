package hostroute

import (
	"context"
	"errors"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
)

// Settings are the host table's settings.
type Settings struct {
	PathSemantics        string // --path-semantics (validated by the config)
	RefuseAmbiguousPaths bool   // --refuse-ambiguous-paths
	File                 string // --hosts: the table's file ("" none)
}

// openRouter is makeRouter with the path policy from s, the table in s.File applied
// when there is one.
func openRouter(s Settings, def *origin.Proxy, base origin.Config, om *origin.Metrics, reg prometheus.Registerer, log *slog.Logger) (*Router, error) {
	sem, err := pathsem.Parse(s.PathSemantics)
	if err != nil {
		return nil, err
	}
	r, err := makeRouter(def, base, hosts.PathPolicy{Semantics: sem, RefuseAmbiguous: s.RefuseAmbiguousPaths}, om, reg, log)
	if err != nil {
		return nil, err
	}
	if s.File != "" {
		if err := r.LoadFile(s.File); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Consul is what the router needs of the Consul link's hosts document
// (consullink.Doc).
type Consul interface {
	// Missing marks the document missing or back; true when that changed.
	Missing(missing bool) bool
	Cache() string          // the last good document's file ("" none)
	Keep(data []byte) error // replaces Cache whole
	Changed()               // has the edge registered again (the table's version)
}

// ApplyConsul applies the region's hosts document as Consul gives it
// (nil: absent). An absent document, once there was one, is missing: the
// table in force stays (a cleared table is an explicit empty document). An
// invalid one is refused and logged; the table in force stays. A good one
// is kept on disk for a restart without Consul, unless it is the PoP's
// canary (canary: a candidate, not the region's table).
func (r *Router) ApplyConsul(doc []byte, canary bool, c Consul) {
	if doc == nil {
		if r.Version() != "" && c.Missing(true) {
			r.log.Warn("host table missing in consul; keeping the table in force", "version", r.Version())
		}
		return
	}
	if err := r.Load(doc); err != nil {
		r.log.Error("host table from consul refused; keeping the table in force", "err", err, "version", r.Version())
		return
	}
	c.Missing(false)
	if canary {
		return // a candidate is never what a restart runs without Consul
	}
	if path := c.Cache(); path != "" {
		if err := c.Keep(doc); err != nil {
			r.log.Warn("could not cache the host table", "path", path, "err", err)
		}
	}
}

// ReadConsul applies the region's hosts document (read) before the first
// request, or the cached one when Consul cannot give it.
func (r *Router) ReadConsul(ctx context.Context, read func(context.Context) ([]byte, error), c Consul) {
	doc, err := read(ctx)
	if err == nil {
		r.ApplyConsul(doc, false, c)
		return
	}
	path := c.Cache()
	if path == "" {
		r.log.Warn("no host table from consul and no cache: every host goes to the default pool until consul answers", "err", err)
		return
	}
	cached, cerr := os.ReadFile(path)
	switch {
	case errors.Is(cerr, os.ErrNotExist):
		// No table cached: the region has none, or this edge never ran.
	case cerr == nil && len(cached) > 0:
		if cerr = r.Load(cached); cerr == nil {
			r.log.Warn("host table from the cache: consul did not answer", "err", err, "version", r.Version())
			return
		}
		fallthrough
	default:
		r.log.Warn("no host table from consul nor from the cache: every host goes to the default pool until consul answers", "err", err, "cache", path, "cache_err", cerr)
	}
}
