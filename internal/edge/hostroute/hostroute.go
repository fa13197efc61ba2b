// Package hostroute picks each request's origin pool by its host. The host
// table (internal/hosts) names pools of origins and maps host names to
// them; a host the table does not name, and every host while there is no
// table, goes to the default pool, the edge's --origin flags.
//
// A new table is applied whole or not at all: its pools are built (a pool
// whose settings did not change is kept, its connections and health with
// it), then the table is swapped in, and the pools no host uses any more
// are closed. A request already on its way to a retired pool finishes
// there. An invalid table is refused, counted and logged, and the table in
// force stays.
package hostroute

import (
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Router maps a request's host to its origin pool. It is safe for
// concurrent use: For is lock-free, Apply is serialised.
type Router struct {
	def  *origin.Proxy
	base origin.Config // the default pool's settings: a pool's unset fields take them
	om   *origin.Metrics
	log  *slog.Logger
	m    metrics
	// paths is the path policy of every host while there is no table,
	// and under a table's defaults (the edge's flags).
	paths hosts.PathPolicy

	mu  sync.Mutex // one Apply at a time
	cur atomic.Pointer[routes]
	// retired are pools no table names any more whose bodies were still
	// streaming: EndStreams reaches them too; each Apply lets go of those
	// done.
	retired []*origin.Proxy
}

// routes is one table in force, with its pools built.
type routes struct {
	ix      *hosts.Index
	pools   map[string]*pool // by name; never "default"
	version string
	hosts   int
}

// pool is one named pool and the settings it was built from.
type pool struct {
	cfg origin.Config
	p   *origin.Proxy
}

// makeRouter routes every host to def until a table is applied. base is the
// settings def was built from; paths the path policy of the hosts no
// table says otherwise of; om the metrics every pool shares.
func makeRouter(def *origin.Proxy, base origin.Config, paths hosts.PathPolicy, om *origin.Metrics, reg prometheus.Registerer, log *slog.Logger) (*Router, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{def: def, base: base, paths: paths, om: om, log: log}
	if err := r.m.register(reg); err != nil {
		return nil, err
	}
	return r, nil
}

// For returns the pool serving host, which rules.NormalizeHost has
// normalised (the form the rules match). It does not allocate.
func (r *Router) For(host string) *origin.Proxy {
	rt := r.cur.Load()
	if rt == nil {
		return r.def
	}
	_, h, ok := rt.ix.Lookup(host)
	if !ok || h.Pool == hosts.DefaultPool {
		return r.def
	}
	if pl := rt.pools[h.Pool]; pl != nil {
		return pl.p
	}
	return r.def // unreachable: Validate checks every host's pool
}

// Route is For with the host's path policy (the table's for the host,
// else its defaults, else the edge's) and its tenant: the name its share of
// the workers is kept under (package shedder's host shares). A table that
// lists hosts makes its entries the tenants: an exact entry is its name, a
// wildcard entry its pattern ("*.example.com", one share for every name
// under it), and every host it does not list is shedder.OtherHost, the
// pooled rest; so a client that sends many names takes one share, not one
// per name. With no table, or one that lists no host, each host is its own
// tenant. It does not allocate.
func (r *Router) Route(host string) (_ *origin.Proxy, _ hosts.PathPolicy, tenant string) {
	rt := r.cur.Load()
	if rt == nil {
		return r.def, r.paths, host
	}
	pattern, h, paths, ok := rt.ix.Route(host)
	switch {
	case !ok && rt.ix.Len() == 0:
		return r.def, paths, host
	case !ok:
		return r.def, paths, shedder.OtherHost
	case h.Pool == hosts.DefaultPool:
		return r.def, paths, pattern
	}
	if pl := rt.pools[h.Pool]; pl != nil {
		return pl.p, paths, pattern
	}
	return r.def, paths, pattern // unreachable: Validate checks every host's pool
}

// Version is the table in force's version; "" while there is none.
func (r *Router) Version() string {
	if rt := r.cur.Load(); rt != nil {
		return rt.version
	}
	return ""
}

// Load parses doc, a host table document, and applies it; on any error
// (counted) the table in force stays.
func (r *Router) Load(doc []byte) error {
	t, err := hosts.Parse(doc)
	if err != nil {
		r.m.loads.WithLabelValues("error").Inc()
		return fmt.Errorf("loading the host table: %w", err)
	}
	return r.Apply(t)
}

// LoadFile is Load of a file, its problems as FILE:LINE.
func (r *Router) LoadFile(path string) error {
	t, err := hosts.ParseFile(path)
	if err != nil {
		r.m.loads.WithLabelValues("error").Inc()
		return fmt.Errorf("loading the host table: %w", err)
	}
	return r.Apply(t)
}

// ReloadFile is LoadFile again (SIGHUP), when there is a file: an invalid
// one is logged, and the table in force stays.
func (r *Router) ReloadFile(path string) {
	if path == "" {
		return
	}
	if err := r.LoadFile(path); err != nil {
		r.log.Error("host table reload refused; keeping the table in force", "err", err, "version", r.Version())
	}
}

// Apply builds t's pools and swaps t in. On any error nothing changes.
func (r *Router) Apply(t *hosts.Table) error {
	if err := r.apply(t); err != nil {
		r.m.loads.WithLabelValues("error").Inc()
		return err
	}
	r.m.loads.WithLabelValues("ok").Inc()
	return nil
}

func (r *Router) apply(t *hosts.Table) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("applying the host table: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	if old != nil && old.version == t.Version() {
		return nil // the table in force (a watch's first answer, a reload of the same file)
	}
	next := &routes{ix: t.IndexOver(r.paths), pools: make(map[string]*pool, len(t.Pools)), version: t.Version(), hosts: len(t.Hosts)}
	var built []*origin.Proxy // new this time: closed again if a later one fails
	for name, p := range t.Pools {
		cfg := p.Origin(r.base)
		cfg.Pool = name
		if old != nil {
			if was := old.pools[name]; was != nil && reflect.DeepEqual(was.cfg, cfg) {
				next.pools[name] = was
				continue
			}
		}
		px, err := origin.NewPool(cfg, r.om, r.log)
		if err != nil {
			for _, b := range built {
				b.Close()
			}
			return fmt.Errorf("building pool %q: %w", name, err)
		}
		built = append(built, px)
		next.pools[name] = &pool{cfg: cfg, p: px}
	}
	r.cur.Store(next)
	r.m.hosts.Set(float64(next.hosts))
	r.m.pools.Set(float64(len(next.pools)))
	if old != nil {
		for name, was := range old.pools {
			if now := next.pools[name]; now != was {
				r.retire(was.p)
			}
		}
	}
	r.log.Info("host table applied", "version", next.version, "hosts", next.hosts, "pools", len(next.pools), "pools_built", len(built))
	return nil
}

// Clear routes every host to the default pool again and closes the pools.
func (r *Router) Clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Swap(nil)
	r.m.hosts.Set(0)
	r.m.pools.Set(0)
	if old != nil {
		for _, was := range old.pools {
			r.retire(was.p)
		}
	}
}

// retire closes p (Serve keeps working for the requests already there)
// and keeps it for EndStreams while its bodies stream. r.mu is held.
func (r *Router) retire(p *origin.Proxy) {
	p.Close()
	r.retired = slices.DeleteFunc(append(r.retired, p), func(q *origin.Proxy) bool { return q.Streaming() == 0 })
}

// EndStreams ends the bodies streaming from every pool, retired ones
// included (a shutdown's drain nearly over).
func (r *Router) EndStreams() {
	r.Each(func(_ string, p *origin.Proxy) { p.EndStreams() })
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.retired {
		p.EndStreams()
	}
}

// Each calls fn with every pool in force, the default first: what the
// edge ends at shutdown (EndStreams) or reports.
func (r *Router) Each(fn func(name string, p *origin.Proxy)) {
	fn(hosts.DefaultPool, r.def)
	if rt := r.cur.Load(); rt != nil {
		for name, pl := range rt.pools {
			fn(name, pl.p)
		}
	}
}

// Close closes every named pool (not the default, which is the caller's).
func (r *Router) Close() { r.Clear() }

// metrics are the router's own; the pools' are origin's, labelled by pool.
type metrics struct {
	loads *prometheus.CounterVec
	hosts prometheus.Gauge
	pools prometheus.Gauge
}

func (m *metrics) register(reg prometheus.Registerer) error {
	m.loads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_hosts_table_loads_total",
		Help: "Host tables applied (outcome ok) or refused (outcome error, the table in force kept).",
	}, []string{"outcome"})
	m.hosts = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edgeguard_hosts_table_hosts",
		Help: "Host names and wildcards in the host table in force (0: none, every host goes to the default pool).",
	})
	m.pools = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edgeguard_hosts_table_pools",
		Help: "Origin pools the host table in force names, beside the default pool.",
	})
	for _, o := range []string{"ok", "error"} {
		m.loads.WithLabelValues(o)
	}
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.loads, m.hosts, m.pools} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("registering host table metrics: %w", err)
		}
	}
	return nil
}
