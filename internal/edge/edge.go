package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

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
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
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
	shed    *shedder.Shedder
	workers *shedder.Workers
	router  *hostroute.Router // each host's origin pool
	tunnels *origin.Tunnels
	pipe    *pipeline.Pipeline // the request path
	consul  *consullink.Link   // nil without --consul

	sockets  *handoff.Sockets // as inherited and as bound, for the next binary on SIGUSR2
	publicLn net.Listener
	tls      *listen.TLS // nil without --listen-tls
	server   *fasthttp.Server
	admin    *admin.Server
	rls      *rlslink.Service // nil without --rls-listen
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
	var labels prometheus.Labels
	if cfg.MetricsRegionLabels {
		labels = prometheus.Labels{"region": cfg.Region, "pop": cfg.PoP}
	}
	var reg prometheus.Registerer
	e.reg, reg = admin.NewRegistry(labels)
	am, err := admin.NewMetrics(reg)
	lm, lerr := listen.NewMetrics(reg)
	cm, cerr := consullink.NewMetrics(reg, am.RulesErrors)
	if err := errors.Join(err, lerr, cerr); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	e.rules = e.newRules(am)
	if cfg.Consul == "" {
		if err := e.rules.LoadFile(cfg.Rules); err != nil {
			return nil, err
		}
	}
	if e.store, err = build.OpenStore(cfg, reg, log); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.store.Close) // closers run in reverse: after what uses the limiter
	if err := e.buildLimits(reg, am.RulesErrors); err != nil {
		return nil, err
	}
	// The edges sharing the origin split adaptive.min_limit.
	if e.shed, e.workers, err = build.Shedder(cfg, int(e.nodesRegion.Load()), reg, log); err != nil {
		return nil, err
	}
	if e.bh, err = bhlayer.New(bhlayer.Config{
		KeySalt: cfg.KeySalt, IPv6Prefix: cfg.IPv6Prefix, RedisTimeout: cfg.RedisTimeout, Store: e.store.Redis, Log: log,
	}, reg); err != nil {
		return nil, fmt.Errorf("building the behaviour layer: %w", err)
	}
	if snap := e.rules.Load(); snap != nil {
		e.bh.RulesChanged(snap)
	}
	o, err := hostroute.OpenOrigins(cfg, reg, log) // the origin pools, the tunnels and the host table
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, o.Close)
	e.router, e.tunnels = o.Router, o.Tunnels
	if err := e.buildPipeline(reg); err != nil {
		return nil, err
	}
	if err := e.listen(listen.NewPublic(listen.SettingsFrom(cfg), lm, log), reg); err != nil {
		return nil, err
	}
	if cfg.Consul != "" {
		if err := e.startConsul(cm); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// buildLimits builds what decides besides the rules: the global rules'
// home regions (with Redis only: the embedded memory store is one region
// by definition) and the rate limit service (with --rls-listen).
func (e *Edge) buildLimits(reg prometheus.Registerer, refused prometheus.Counter) error {
	if e.cfg.Redis != "" {
		gr, err := globalhome.New(e.store.Limiter, globalhome.Options{
			Region: e.cfg.Region, ConsulPrefix: e.cfg.ConsulPrefix, Log: e.log,
			SetMissing:          func(missing bool) bool { return e.consul.SetMissing(consullink.DocCatalog, missing) },
			Refused:             refused.Inc,
			ReachabilityChanged: e.announce,
		}, reg)
		if err != nil {
			return err
		}
		e.global = gr
		e.closers = append(e.closers, gr.Close) // before the limiter closes
	}
	s, err := rlslink.New(e.cfg.RLS, rlslink.Options{
		Limiter: e.store.Limiter, Nodes: func() int { return int(e.nodesRegion.Load()) },
		KeySalt: e.cfg.KeySalt, IPv6Prefix: e.cfg.IPv6Prefix, ConsulPrefix: e.cfg.ConsulPrefix, Region: e.cfg.Region, Log: e.log,
		Bind: func(addr string) (net.Listener, error) { return e.sockets.Bind(handoff.RLS, addr) },
	}, reg)
	if err != nil || s == nil {
		return err
	}
	e.closers = append(e.closers, s.Close)
	e.rls = s
	return nil
}

// buildPipeline builds the request path (package pipeline) from the parts.
func (e *Edge) buildPipeline(reg prometheus.Registerer) error {
	p, err := pipeline.New(build.PipelineConfig(e.cfg), e.log, pipeline.Limits{
		Limiter: e.store.Limiter, Penalties: e.store.Penalties, StoreName: e.store.Name,
		Rules: e.rules.Pointer(), NodesRegion: &e.nodesRegion, NodesPoP: &e.nodesPoP,
	}, pipeline.Parts{
		Behaviour: e.bh, Shedder: e.shed, Workers: e.workers, Route: e.router.Route, Tunnels: e.tunnels,
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
func (e *Edge) listen(public *listen.Public, reg prometheus.Registerer) error {
	e.server = public.NewServer(e.pipe.Handle, e.pipe.ServerError, e.pipe.Expect)
	ln, err := e.sockets.Bind(handoff.Public, e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", e.cfg.Listen, err)
	}
	e.publicLn = public.Stack(ln, []byte(listen.TooManyConns))
	e.closers = append(e.closers, func() { _ = e.publicLn.Close() })
	if e.cfg.ListenTLS != "" {
		t, err := public.OpenTLS(func() (net.Listener, error) { return e.sockets.Bind(handoff.TLS, e.cfg.ListenTLS) }, e.server, e.cfg.Consul != "")
		if err != nil {
			return err
		}
		e.tls = t
		e.closers = append(e.closers, func() { _ = t.Ln.Close() })
	}
	if err := admin.RegisterServing(reg, func() float64 { return float64(e.server.GetOpenConnectionsCount()) }, e.ready()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	adminLn, err := e.sockets.Bind(handoff.Admin, e.cfg.Admin)
	if err != nil {
		return fmt.Errorf("listening on %s (admin): %w", e.cfg.Admin, err)
	}
	e.closers = append(e.closers, func() { _ = adminLn.Close() })
	e.admin = admin.NewServer(admin.Config{
		Registry: e.reg, Ready: e.ready(), Rules: e.rules.InForce, Region: e.cfg.Region, PoP: e.cfg.PoP,
		Clients: e.bh.DebugClients, Token: e.cfg.AdminToken, Pprof: e.cfg.Pprof,
	}, adminLn)
	return nil
}

// ready is what /readyz and the ready gauge answer from.
func (e *Edge) ready() admin.Readiness {
	return admin.Readiness{
		Draining:    e.draining.Load,
		RulesLoaded: func() bool { return e.rules.Load() != nil },
		Health:      func() limiter.Health { return e.store.Limiter.Health() },
		Store:       e.store.Name,
		Missing:     func() string { return e.consul.MissingDetail() }, // e.consul is set by startConsul, after this
		Serving:     e.serving.Load,
	}
}

// Addr, AdminAddr, TLSAddr and RLSAddr are the bound addresses (useful
// with port 0; TLSAddr "" without --listen-tls, RLSAddr without
// --rls-listen).
func (e *Edge) Addr() string      { return e.publicLn.Addr().String() }
func (e *Edge) AdminAddr() string { return e.admin.Ln.Addr().String() }
func (e *Edge) TLSAddr() string   { return e.tls.Addr() }
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
	build.ReloadShedder(e.shed, e.cfg.Shedder, e.log)
	e.router.ReloadFile(e.cfg.Hosts)
}

// newRules are the rules in force (package liverules); a change flushes
// what the old rules decided.
func (e *Edge) newRules(m *admin.Metrics) *liverules.Rules {
	return liverules.New(liverules.Config{
		CompileOptions: e.cfg.CompileOptions,
		Check:          e.cfg.CheckRules,
		Changed: func(snap *rules.Snapshot) {
			pipeline.ForgetPolicies() // the old snapshot's rules
			if e.store != nil {
				e.store.Limiter.Flush()
			}
			if e.bh != nil {
				e.bh.RulesChanged(snap)
			}
		},
		Announced: e.announce,
		Metrics:   liverules.Metrics{Info: m.RulesInfo, Loaded: m.RulesLoaded, Errors: m.RulesErrors},
		Log:       e.log,
	})
}

// announce registers the edge again with what changed (with Consul).
func (e *Edge) announce() {
	if e.consul != nil {
		e.consul.RulesChanged()
	}
}

// Run serves until ctx is done, then drains and shuts down (package
// lifecycle).
func (e *Edge) Run(ctx context.Context) error {
	defer e.close()
	quiet := listen.NewQuiet() // the public connections that have sent nothing yet
	p := lifecycle.Plan{
		Background: []func(context.Context){
			func(ctx context.Context) { _ = e.shed.Run(ctx, 50*time.Millisecond, e.workers.Utilization) },
			e.bh.Run,
		},
		Servers: []lifecycle.Server{{Name: "public server", Serve: func() error { return e.server.Serve(listen.Framed(e.publicLn, quiet)) }}},
		Reopen:  e.pipe.ReopenAccessLog, Reload: e.reloadFiles,
		Sockets: e.sockets,
		Serving: func() { e.serving.Store(true) },
		Ready:   func() bool { return e.ready().Value() == 1 },
		Drain: func() {
			e.draining.Store(true)
			if e.rls != nil {
				e.rls.SetServing(false) // health checks see the drain at once
			}
		},
		DrainDelay: e.cfg.DrainDelay,
		Shutdown: lifecycle.Shutdown{
			Timeout: e.cfg.ShutdownTimeout,
			Cut:     func() { e.router.EndStreams(); e.tunnels.End() },
			Public:  e.server.ShutdownWithContext, Listeners: []net.Listener{e.publicLn},
			Tunnels: e.tunnels.Wait, Admin: e.admin.Shutdown, Quiet: quiet.CloseIdle,
		},
		Log:     e.log,
		Started: []any{"listen", e.Addr(), "listen_tls", e.TLSAddr(), "admin", e.AdminAddr(), "region", e.cfg.Region, "pop", e.cfg.PoP, "store", e.store.Name},
	}
	if e.tls != nil {
		p.Servers = append(p.Servers, lifecycle.Server{Name: "public TLS server", Serve: func() error { return e.server.Serve(listen.Framed(e.tls.Ln, quiet)) }})
		p.Background = append(p.Background, e.tls.Certs.Watch)
		p.Shutdown.Listeners = append(p.Shutdown.Listeners, e.tls.Ln)
	}
	if h2 := e.tls.HTTP2(); h2 != nil {
		p.Servers = append(p.Servers, lifecycle.Server{Name: "public HTTP/2 server", Serve: h2.Serve})
		p.Shutdown.HTTP2 = h2.Shutdown
	}
	if e.rls != nil {
		p.Servers = append(p.Servers, lifecycle.Server{Name: "rate limit service", Serve: e.rls.Serve})
		p.Shutdown.RLS = e.rls.Stop
	}
	p.Servers = append(p.Servers, lifecycle.Server{Name: "admin server", Serve: e.admin.Serve})
	if e.consul != nil {
		p.Catalog = e.consul
	}
	return lifecycle.Run(ctx, p)
}

func (e *Edge) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}
