package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/admin"
	"github.com/edgeguard/edgeguard/internal/edge/bhlayer"
	"github.com/edgeguard/edgeguard/internal/edge/build"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/globalhome"
	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/edge/hostroute"
	"github.com/edgeguard/edgeguard/internal/edge/lifecycle"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/edge/liverules"
	"github.com/edgeguard/edgeguard/internal/edge/pipeline"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Edge is one edge node: its parts, each built by its own package.
type Edge struct {
	cfg                   config.Config
	log                   *slog.Logger
	reg                   *prometheus.Registry
	closers               []func() // run in reverse by close
	draining, serving     atomic.Bool
	nodesRegion, nodesPoP atomic.Int64 // fallback divisors: flags, then the catalog

	store   *build.Store        // the rate limit store and its limiter
	global  *globalhome.Regions // scope: global rules (nil without Redis)
	rules   *liverules.Rules
	bh      *bhlayer.Layer
	shed    *build.Shed
	origins *hostroute.Origins // each host's origin pool, and the tunnels
	pipe    *pipeline.Pipeline // the request path
	consul  *consullink.Link   // nil without --consul: built before the parts that read through it

	sockets *handoff.Sockets // as inherited and as bound, for the next binary on SIGUSR2
	front   *listen.Front    // the public server and its listeners
	admin   *admin.Server
	rls     *rlslink.Service // nil without --rls-listen
}

// New builds an edge from cfg: it loads the rules (refusing to start on an
// invalid file), connects nothing yet (Redis may be down: the fallback
// decides until it is back), and binds both listeners.
func New(cfg config.Config, log *slog.Logger) (*Edge, error) {
	return NewInherited(cfg, log, nil)
}

// NewInherited is New with the listening sockets this process inherited
// (handoff.Inherited): each listener named there is used instead of bound.
// An inherited socket no listener takes is closed and logged.
func NewInherited(cfg config.Config, log *slog.Logger, inherited *handoff.Set) (_ *Edge, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Edge{cfg: cfg, log: log, sockets: handoff.NewSockets(inherited, log)}
	e.nodesRegion.Store(int64(cfg.NodesInRegion))
	e.nodesPoP.Store(int64(cfg.NodesInPoP))
	defer func() {
		// After a failure the listeners not reached yet are not news.
		if unused := inherited.Close(); err == nil && len(unused) > 0 {
			log.Warn("inherited sockets not used by any listener; closed", "names", unused, "from", inherited.From)
		}
		if err != nil {
			e.close()
		}
	}()
	var reg prometheus.Registerer
	e.reg, reg = admin.NewRegistry(cfg)
	rm, err := liverules.NewMetrics(reg)
	lm, lerr := listen.NewMetrics(reg)
	cm, cerr := consullink.NewMetrics(reg, rm.Errors)
	if err := errors.Join(err, lerr, cerr); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	if e.consul, err = consullink.Open(cfg, cm, stateDir, log); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.consul.Close) // closers run in reverse: the agent's connections last
	if e.store, err = build.OpenStore(cfg, reg, log); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.store.Close) // after what uses the limiter
	e.global, err = globalhome.Open(cfg, e.store.Limiter, globalhome.Options{
		Log: log, SetMissing: e.consul.Doc(consullink.DocCatalog).Missing, Refused: rm.Errors.Inc, ReachabilityChanged: e.announce,
	}, reg)
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.global.Close) // before the limiter closes
	e.rls, err = rlslink.Open(cfg, rlslink.Options{
		Limiter: e.store.Limiter, Nodes: func() int { return int(e.nodesRegion.Load()) },
		Bind: e.sockets.Binder(handoff.RLS), Draining: e.draining.Load, Log: log,
	}, reg)
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.rls.Close)
	// The edges sharing the origin split adaptive.min_limit.
	if e.shed, err = build.Shedder(cfg, int(e.nodesRegion.Load()), reg, log); err != nil {
		return nil, err
	}
	if e.bh, err = bhlayer.Open(cfg, e.store.Redis, reg, log); err != nil {
		return nil, err
	}
	e.rules = liverules.New(liverules.Config{
		CompileOptions: cfg.CompileOptions, Check: cfg.CheckRules, Changed: e.rulesChanged, Announced: e.announce, Metrics: rm, Log: log,
	})
	if cfg.Consul == "" {
		if err := e.rules.LoadFile(cfg.Rules); err != nil {
			return nil, err
		}
	}
	if e.origins, err = hostroute.OpenOrigins(cfg, reg, log); err != nil { // the origin pools, the tunnels and the host table
		return nil, err
	}
	e.closers = append(e.closers, e.origins.Close)
	if err := e.buildPipeline(reg); err != nil {
		return nil, err
	}
	if err := e.listen(listen.NewPublic(listen.SettingsFrom(cfg), lm, log), reg); err != nil {
		return nil, err
	}
	if err := e.startConsul(); err != nil {
		return nil, err
	}
	return e, nil
}

// buildPipeline builds the request path (package pipeline) from the parts.
func (e *Edge) buildPipeline(reg prometheus.Registerer) error {
	p, err := pipeline.New(build.PipelineConfig(e.cfg), e.log, pipeline.Limits{
		Limiter: e.store.Limiter, Penalties: e.store.Penalties, StoreName: e.store.Name,
		Rules: e.rules.Pointer(), NodesRegion: &e.nodesRegion, NodesPoP: &e.nodesPoP,
	}, pipeline.Parts{
		Behaviour: e.bh, Shedder: e.shed.Shedder, Workers: e.shed.Workers, Route: e.origins.Router.Route, Tunnels: e.origins.Tunnels,
		Draining: &e.draining, AccessLogRegistry: e.reg,
		Conns: pipeline.Conns{
			JA4: listen.JA4Of, CertCovers: listen.CertCovers, Gone: listen.ClientGone, Sent: listen.ClientSent,
			ClosesAfter: listen.ClosesAfter, Framing: listen.FramingRefusal, FramingReasons: listen.FramingReasons,
		},
	}, reg)
	if err != nil {
		return err
	}
	e.pipe = p
	e.closers = append(e.closers, p.Close)
	return nil
}

// listen opens the public listeners (TLS too, when configured) and the
// admin server's, and registers the metrics that read the server.
func (e *Edge) listen(public *listen.Public, reg prometheus.Registerer) (err error) {
	bind := e.sockets.Binder
	if e.front, err = public.OpenFront(e.pipe.Handle, e.pipe.ServerError, e.pipe.Expect, bind(handoff.Public), bind(handoff.TLS), e.cfg.Consul != ""); err != nil {
		return err
	}
	e.closers = append(e.closers, e.front.Close)
	open := func() float64 { return float64(e.front.Server.GetOpenConnectionsCount()) }
	if e.admin, err = admin.Open(e.cfg, admin.Config{Registry: e.reg, Ready: e.ready(), Rules: e.rules.InForce, Clients: e.bh.DebugClients}, reg, open, bind(handoff.Admin)); err != nil {
		return err
	}
	e.closers = append(e.closers, e.admin.Close)
	return nil
}

// ready is what /readyz and the ready gauge answer from.
func (e *Edge) ready() admin.Readiness {
	return admin.Readiness{
		Draining:    e.draining.Load,
		RulesLoaded: func() bool { return e.rules.Load() != nil },
		Health:      e.store.Limiter.Health,
		Store:       e.store.Name,
		Missing:     e.consul.MissingDetail,
		Serving:     e.serving.Load,
	}
}

// Addr, AdminAddr, TLSAddr and RLSAddr are the bound addresses (useful
// with port 0; TLSAddr "" without --listen-tls, RLSAddr without
// --rls-listen).
func (e *Edge) Addr() string      { return e.front.Addr() }
func (e *Edge) AdminAddr() string { return e.admin.Addr() }
func (e *Edge) TLSAddr() string   { return e.front.TLS.Addr() }
func (e *Edge) RLSAddr() string   { return e.rls.Addr() }

// ApplyRules parses, validates and compiles a rules document and swaps it in.
// An invalid document is refused (counted, and the error names the rule and
// field); the rules in force stay.
func (e *Edge) ApplyRules(data []byte) error { return e.rules.Apply(data) }

// reloadFiles re-reads the rules, shedder and host table files (SIGHUP). Each keeps its
// current settings when the new file is invalid.
func (e *Edge) reloadFiles() {
	e.rls.Reload()
	e.rules.ReloadFile(e.cfg.Rules)
	e.shed.Reload()
	e.origins.Router.ReloadFile(e.cfg.Hosts)
}

// rulesChanged flushes what the old rules decided, and gives the
// behaviour layer the new rules' section.
func (e *Edge) rulesChanged(snap *rules.Snapshot) {
	pipeline.ForgetPolicies() // the old snapshot's rules
	e.store.Limiter.Flush()
	e.bh.RulesChanged(snap)
}

// announce registers the edge again with what changed (with Consul).
func (e *Edge) announce() { e.consul.RulesChanged() }

// Run serves until ctx is done, then drains and shuts down (package
// lifecycle).
func (e *Edge) Run(ctx context.Context) error {
	defer e.close()
	p := lifecycle.Plan{
		Front:      e.front,
		Background: []func(context.Context){e.shed.Sample, e.bh.Run},
		Reopen:     e.pipe.ReopenAccessLog, Reload: e.reloadFiles,
		Sockets: e.sockets,
		Serving: func() { e.serving.Store(true) },
		Ready:   func() bool { return e.ready().Value() == 1 },
		Drain: func() {
			e.draining.Store(true)
			e.rls.SetServing(false) // health checks see the drain at once
		},
		DrainDelay: e.cfg.DrainDelay,
		Shutdown: lifecycle.Shutdown{
			Timeout: e.cfg.ShutdownTimeout,
			Cut:     e.origins.End, Tunnels: e.origins.Tunnels.Wait, Admin: e.admin.Shutdown,
		},
		Catalog: e.consul,
		Log:     e.log,
		Started: []any{"listen", e.Addr(), "listen_tls", e.TLSAddr(), "admin", e.AdminAddr(), "region", e.cfg.Region, "pop", e.cfg.PoP, "store", e.store.Name},
	}
	if e.rls != nil {
		p.Servers = append(p.Servers, lifecycle.Server{Name: "rate limit service", Serve: e.rls.Serve})
		p.Shutdown.RLS = e.rls.Stop
	}
	p.Servers = append(p.Servers, lifecycle.Server{Name: "admin server", Serve: e.admin.Serve})
	return lifecycle.Run(ctx, p)
}

func (e *Edge) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}
