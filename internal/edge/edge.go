package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/admin"
	"github.com/edgeguard/edgeguard/internal/edge/bhlayer"
	"github.com/edgeguard/edgeguard/internal/edge/build"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/globalhome"
	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/edge/hostroute"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/edge/liverules"
	"github.com/edgeguard/edgeguard/internal/edge/pipeline"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Edge is one edge node.
type Edge struct {
	cfg  config.Config
	log  *slog.Logger
	reg  *prometheus.Registry
	pipe *pipeline.Pipeline // the request path (package pipeline)

	rules                 *liverules.Rules
	nodesRegion, nodesPoP atomic.Int64 // fallback divisors: flags, then the catalog
	consul                *consullink.Link
	global                *globalhome.Regions // scope: global rules (package globalhome)
	closers               []func()
	draining              atomic.Bool
	serving               atomic.Bool

	store *build.Store // the rate limit store and its limiter
	parts
	servers
}

// parts are the other parts requests go through.
type parts struct {
	bh      *bhlayer.Layer
	router  *hostroute.Router // each host's origin pool
	tunnels *origin.Tunnels
	shed    *shedder.Shedder
	workers *shedder.Workers
}

// servers are the listeners and the servers on them.
type servers struct {
	publicLn net.Listener
	tls      *listen.TLS // nil without --listen-tls
	server   *fasthttp.Server
	admin    *admin.Server
	rls      *rlslink.Service // nil without --rls-listen
	// sockets are the sockets this process was started with (package
	// handoff) and each listener as bound, before the accept stack, for
	// the next binary on SIGUSR2.
	sockets *handoff.Sockets
}

// buildGlobal gives the limiter its Global (with Redis only: the
// embedded memory store is one region by definition).
func (e *Edge) buildGlobal(reg prometheus.Registerer, refused prometheus.Counter) error {
	if e.cfg.Redis == "" {
		return nil
	}
	gr, err := globalhome.New(e.store.Limiter, globalhome.Options{
		Region:       e.cfg.Region,
		ConsulPrefix: e.cfg.ConsulPrefix,
		Log:          e.log,
		SetMissing:   func(missing bool) bool { return e.consul.SetMissing(consullink.DocCatalog, missing) },
		Refused:      func() { refused.Inc() },
		ReachabilityChanged: func() {
			if e.consul != nil {
				e.consul.RulesChanged()
			}
		},
	}, reg)
	if err != nil {
		return err
	}
	e.global = gr
	e.closers = append(e.closers, gr.Close) // before the limiter closes
	return nil
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
	e := newEdge(cfg, log)
	e.sockets = handoff.NewSockets(inherited, log)
	defer func() {
		// After a failure the listeners not reached yet are not news.
		if unused := inherited.Close(); err == nil && len(unused) > 0 {
			log.Warn("inherited sockets not used by any listener; closed", "names", unused, "from", inherited.From)
		}
	}()
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	reg, m, err := e.registerMetrics()
	if err != nil {
		return nil, err
	}
	e.rules = e.newRules(m.admin)
	if cfg.Consul == "" {
		if err := e.rules.LoadFile(cfg.Rules); err != nil {
			return nil, err
		}
	}
	if e.store, err = build.OpenStore(cfg, reg, log); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.store.Close) // closers run in reverse: after what uses the limiter
	if err := e.buildGlobal(reg, m.admin.RulesErrors); err != nil {
		return nil, err
	}
	if err := e.buildRLS(reg); err != nil {
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
	if err := e.buildProxy(reg); err != nil {
		return nil, err
	}
	if err := e.buildPipeline(reg); err != nil {
		return nil, err
	}
	public := listen.NewPublic(listen.SettingsFrom(cfg), m.listen, log)
	e.server = public.NewServer(e.pipe.Handle, e.pipe.ServerError, e.pipe.Expect)
	if err := e.listen(public, reg, admin.Config{
		Registry: e.reg,
		Ready:    e.ready(),
		Rules:    e.rules.InForce,
		Region:   cfg.Region,
		PoP:      cfg.PoP,
		Clients:  e.bh.DebugClients,
		Token:    cfg.AdminToken,
		Pprof:    cfg.Pprof,
	}); err != nil {
		return nil, err
	}
	if cfg.Consul != "" {
		if err := e.startConsul(m.consul); err != nil {
			return nil, err
		}
	}
	ok = true
	return e, nil
}

// newEdge is an edge with what cfg says directly and nothing built yet.
func newEdge(cfg config.Config, log *slog.Logger) *Edge {
	e := &Edge{
		cfg: cfg,
		log: log,
		reg: prometheus.NewRegistry(),
	}
	e.nodesRegion.Store(int64(cfg.NodesInRegion))
	e.nodesPoP.Store(int64(cfg.NodesInPoP))
	return e
}

// meters are the metrics the edge hands its parts.
type meters struct {
	admin  *admin.Metrics     // the rules' and the build's
	listen *listen.Metrics    // the listeners'
	consul consullink.Metrics // the Consul link's
}

// registerMetrics registers the edge's metrics, and the Go runtime's and
// the process's, and returns the registerer the parts register theirs
// with.
func (e *Edge) registerMetrics() (prometheus.Registerer, meters, error) {
	// region and pop are target labels, attached by Prometheus from the
	// Consul service meta; the edge adds them itself only when asked.
	var reg prometheus.Registerer = e.reg
	if e.cfg.MetricsRegionLabels {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"region": e.cfg.Region, "pop": e.cfg.PoP}, e.reg)
	}
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var m meters
	var err, lerr, cerr error
	m.admin, err = admin.NewMetrics(reg)
	m.listen, lerr = listen.NewMetrics(reg)
	m.consul, cerr = consullink.NewMetrics(reg, m.admin.RulesErrors)
	if err := errors.Join(err, lerr, cerr); err != nil {
		return nil, m, fmt.Errorf("registering metrics: %w", err)
	}
	return reg, m, nil
}

// buildProxy builds the origin pools, the tunnels and the host table
// (package hostroute).
func (e *Edge) buildProxy(reg prometheus.Registerer) error {
	o, err := hostroute.OpenOrigins(e.cfg, reg, e.log)
	if err != nil {
		return err
	}
	e.closers = append(e.closers, o.Close)
	e.router, e.tunnels = o.Router, o.Tunnels
	return nil
}

// buildPipeline builds the request path (package pipeline) from the parts.
func (e *Edge) buildPipeline(reg prometheus.Registerer) error {
	c := e.cfg
	p, err := pipeline.New(build.PipelineConfig(c), e.log, pipeline.Limits{
		Limiter: e.store.Limiter, Penalties: e.store.Penalties, StoreName: e.store.Name,
		Rules: e.rules.Pointer(), NodesRegion: &e.nodesRegion, NodesPoP: &e.nodesPoP,
	}, pipeline.Parts{
		Behaviour: e.bh, Shedder: e.shed, Workers: e.workers, Route: e.router.Route, Tunnels: e.tunnels,
		Draining: &e.draining, AccessLogRegistry: e.reg,
		Conns: pipeline.Conns{
			JA4:            listen.JA4Of,
			CertCovers:     listen.CertCovers,
			Gone:           listen.ClientGone,
			Sent:           listen.ClientSent,
			ClosesAfter:    listen.ClosesAfter,
			Framing:        framingRefusal,
			FramingReasons: listen.FramingReasons,
		},
	}, reg)
	if err != nil {
		return err
	}
	e.pipe = p
	e.closers = append(e.closers, p.Close)
	return nil
}

// framingRefusal is the refusal of a request whose framing listen's reader
// refused (ok false for any other error).
func framingRefusal(err error) (reason string, status int, detail string, ok bool) {
	var fe *listen.FramingError
	if !errors.As(err, &fe) {
		return "", 0, "", false
	}
	return fe.Reason, fe.Status, fe.Detail, true
}

// listen opens the public listeners (TLS too, when configured) and the
// admin server's, and registers the metrics that read the server.
func (e *Edge) listen(public *listen.Public, reg prometheus.Registerer, ac admin.Config) error {
	var err error
	if e.publicLn, err = e.sockets.Bind(handoff.Public, e.cfg.Listen); err != nil {
		return fmt.Errorf("listening on %s: %w", e.cfg.Listen, err)
	}
	e.publicLn = public.Stack(e.publicLn, []byte(listen.TooManyConns))
	if e.cfg.ListenTLS != "" {
		t, err := public.OpenTLS(func() (net.Listener, error) { return e.sockets.Bind(handoff.TLS, e.cfg.ListenTLS) }, e.server, e.cfg.Consul != "")
		if err != nil {
			return err
		}
		e.tls = t
	}
	server := e.server
	if err := admin.RegisterServing(reg, func() float64 { return float64(server.GetOpenConnectionsCount()) }, e.readyValue); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	adminLn, err := e.sockets.Bind(handoff.Admin, e.cfg.Admin)
	if err != nil {
		return fmt.Errorf("listening on %s (admin): %w", e.cfg.Admin, err)
	}
	e.admin = admin.NewServer(ac, adminLn)
	return nil
}

// Addr and AdminAddr are the bound addresses (useful with port 0).
func (e *Edge) Addr() string      { return e.publicLn.Addr().String() }
func (e *Edge) AdminAddr() string { return e.admin.Ln.Addr().String() }

// ApplyRules parses, validates and compiles a rules document and swaps it in.
// An invalid document is refused (counted, and the error names the rule and
// field); the rules in force stay.
func (e *Edge) ApplyRules(data []byte) error { return e.rules.Apply(data) }

// reloadFiles re-reads the rules, shedder and host table files (SIGHUP). Each keeps its
// current settings when the new file is invalid.
func (e *Edge) reloadFiles() {
	if e.rls != nil {
		e.rls.Reload()
	}
	if e.cfg.Rules != "" {
		if err := e.rules.LoadFile(e.cfg.Rules); err != nil {
			e.log.Error("rules reload refused; keeping the rules in force", "err", err, "version", e.rules.Load().Version())
		}
	}
	if e.cfg.Shedder != "" {
		if err := build.LoadShedder(e.shed, e.cfg.Shedder, e.log); err != nil {
			e.log.Error("shedder reload refused; keeping the settings in force", "err", err)
		}
	}
	if e.cfg.Hosts != "" {
		if err := e.router.LoadFile(e.cfg.Hosts); err != nil {
			e.log.Error("host table reload refused; keeping the table in force", "err", err, "version", e.router.Version())
		}
	}
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
		Announced: func() {
			if e.consul != nil {
				e.consul.RulesChanged()
			}
		},
		Metrics: liverules.Metrics{Info: m.RulesInfo, Loaded: m.RulesLoaded, Errors: m.RulesErrors},
		Log:     e.log,
	})
}

// Run serves until ctx is done, then shuts down gracefully: /readyz turns
// 503 at once, the drain delay lets load balancers notice, the listener
// closes, and in-flight requests finish (within ShutdownTimeout). Run owns
// every goroutine it starts: none is left when it returns.
func (e *Edge) Run(ctx context.Context) error {
	defer e.close()
	var wg sync.WaitGroup
	// Stopped last, in reverse order of their defers: the sampler keeps
	// shedding while the edge drains.
	samplerCtx, stopSampler := context.WithCancel(context.Background())
	defer wg.Wait()
	defer stopSampler()
	wg.Go(func() { _ = e.shed.Run(samplerCtx, 50*time.Millisecond, e.workers.Utilization) })
	wg.Go(func() { e.bh.Run(samplerCtx) })

	// The signals are caught before the edge can answer ready: a signal
	// Go has not been told to deliver is dropped, so an upgrade or reload
	// asked for just after the edge turned ready would be lost.
	// signal.Stop never closes hup, so the reload loop ends on its own
	// channel.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(hup)
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)

	// Ready to be counted as serving from here: the listeners are bound
	// (New), so a connection made from now on is accepted, and no answer
	// can reach a client before the gauge says ready.
	e.serving.Store(true)
	errc := e.serve(samplerCtx, &wg)
	var consulWG sync.WaitGroup
	consulCtx, stopConsul := context.WithCancel(context.Background())
	defer consulWG.Wait()
	defer stopConsul()
	if e.consul != nil {
		consulWG.Go(func() { e.consul.Run(consulCtx) })
	}
	stopReload := make(chan struct{})
	defer close(stopReload)
	wg.Go(func() { e.reloadOnSignal(hup, stopReload) })
	handedOver := make(chan struct{})
	wg.Go(func() { handoff.UpgradeOnSignal(usr2, stopReload, handedOver, e.sockets.Exe, e.sockets.Bound, e.log) })
	if e.sockets.Inherited.Upgrading() {
		wg.Go(func() { e.sockets.Inherited.TellWhenReady(ctx, func() bool { return e.readyValue() == 1 }, e.log) })
	} else if err := handoff.Notify(handoff.ReadyState(false)); err != nil {
		e.log.Warn("service manager not told the edge is ready", "err", err)
	}
	e.log.Info("edge serving", "pid", os.Getpid(), "listen", e.Addr(), "listen_tls", e.TLSAddr(), "admin", e.AdminAddr(), "region", e.cfg.Region, "pop", e.cfg.PoP, "store", e.store.Name)

	var serveErr error
	upgraded := false
	select {
	case serveErr = <-errc:
		e.log.Error("server failed; shutting down", "err", serveErr)
	case <-ctx.Done():
	case <-handedOver:
		// The new edge serves the same sockets: nothing for load balancers
		// or the catalog to notice, so no drain delay, no 503 on /readyz,
		// no deregistration (the new edge holds the same registration).
		upgraded = true
	}
	if !upgraded {
		e.draining.Store(true)
		if e.rls != nil {
			e.rls.SetServing(false) // health checks see the drain at once
		}
	}
	if e.consul != nil {
		// Stopped first, so a rules change while draining cannot register
		// the edge again after it left the catalog.
		stopConsul()
		consulWG.Wait()
		if !upgraded {
			e.consul.Deregister()
		}
	}
	if serveErr == nil && !upgraded {
		e.log.Info("draining", "delay", e.cfg.DrainDelay)
		time.Sleep(e.cfg.DrainDelay)
	}
	err := e.shutdown()
	e.log.Info("edge stopped", "err", err)
	return errors.Join(serveErr, err)
}

// serve runs the public servers (plain, TLS, HTTP/2), the rate limit
// service and the admin server on wg until they are shut down; the first
// that fails says why on the channel returned.
func (e *Edge) serve(ctx context.Context, wg *sync.WaitGroup) <-chan error {
	errc := make(chan error, 5)
	run := func(what string, serve func() error) {
		wg.Go(func() {
			if err := serve(); err != nil {
				errc <- fmt.Errorf("%s: %w", what, err)
			}
		})
	}
	run("public server", func() error { return e.server.Serve(listen.Framed(e.publicLn)) })
	if e.tls != nil {
		run("public TLS server", func() error { return e.server.Serve(listen.Framed(e.tls.Ln)) })
		wg.Go(func() { e.tls.Certs.Watch(ctx) })
	}
	if h2 := e.h2(); h2 != nil {
		run("public HTTP/2 server", h2.Serve)
	}
	if e.rls != nil {
		run("rate limit service", e.rls.Serve)
	}
	run("admin server", e.admin.Serve)
	return errc
}

// shutdown stops every server, letting what each has in flight finish
// within the shutdown timeout.
func (e *Edge) shutdown() error {
	// A fresh context: the one that asked us to stop is already done.
	sctx, cancel := context.WithTimeout(context.Background(), e.cfg.ShutdownTimeout)
	defer cancel()
	// Response bodies still streaming from an origin near the end of the
	// drain (event streams, long downloads) are cut then, so their
	// connections close and the servers stop within the timeout.
	// Tunnels (WebSocket) end then too: fasthttp's shutdown does not
	// wait for hijacked connections, so they are closed within the drain
	// rather than cut when the process exits.
	if e.router != nil {
		endStreams := time.AfterFunc(e.cfg.ShutdownTimeout-streamGrace(e.cfg.ShutdownTimeout), func() {
			e.router.EndStreams()
			if e.tunnels != nil {
				e.tunnels.End()
			}
		})
		defer endStreams.Stop()
	}
	// The HTTP/2 connections drain at the same time: each server waits
	// for its own.
	h2done := make(chan error, 1)
	if h2 := e.h2(); h2 != nil {
		go func() { h2done <- h2.Shutdown(sctx) }()
	} else {
		h2done <- nil
	}
	e.stopRLS(sctx) // health NOT_SERVING at once, then calls in flight finish
	err := e.server.ShutdownWithContext(sctx)
	// fasthttp's shutdown closes the listeners its Serve calls had
	// registered; a Serve that had not got that far yet (an edge stopped
	// as soon as it started) would then accept forever. Closing them here
	// ends it too (a listener already closed only returns an error).
	_ = e.publicLn.Close()
	if e.tls != nil {
		_ = e.tls.Ln.Close()
	}
	if e.tunnels != nil {
		// Tunnels are hijacked connections, which the server's shutdown
		// does not wait for: they may finish on their own until the
		// timer above ends them.
		if terr := e.tunnels.Wait(sctx); terr != nil && err == nil {
			err = fmt.Errorf("waiting for tunnels: %w", terr)
		}
	}
	if aerr := e.admin.Shutdown(sctx); aerr != nil && err == nil {
		err = fmt.Errorf("shutting down the admin server: %w", aerr)
	}
	if herr := <-h2done; herr != nil && err == nil {
		err = fmt.Errorf("shutting down the HTTP/2 server: %w", herr)
	}
	return err
}

// streamGrace is how long before the end of a drain streamed responses
// are cut: enough for their connections to close and the servers to see
// them gone (fasthttp looks every 100 ms).
func streamGrace(shutdown time.Duration) time.Duration {
	return min(time.Second, shutdown/4)
}

// reloadOnSignal re-reads the files on every SIGHUP and reopens the access
// log on SIGHUP and SIGUSR1, until stop is closed.
func (e *Edge) reloadOnSignal(sig <-chan os.Signal, stop <-chan struct{}) {
	for {
		select {
		case s := <-sig:
			if err := e.pipe.ReopenAccessLog(); err != nil {
				e.log.Error("access log not reopened; writing to the old file", "err", err)
			}
			if s == syscall.SIGHUP {
				e.reloadFiles()
			}
		case <-stop:
			return
		}
	}
}

func (e *Edge) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
	lns := []net.Listener{e.publicLn}
	if e.tls != nil {
		lns = append(lns, e.tls.Ln)
	}
	if e.admin != nil {
		lns = append(lns, e.admin.Ln)
	}
	for _, ln := range lns {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// ready is what /readyz and the ready gauge answer from.
func (e *Edge) ready() admin.Readiness {
	return admin.Readiness{
		Draining:    e.draining.Load,
		RulesLoaded: func() bool { return e.rules.Load() != nil },
		Health:      func() limiter.Health { return e.store.Limiter.Health() },
		Store:       e.store.Name,
		Missing:     func() string { return e.consul.MissingDetail() }, // e.consul is set by startConsul, after this
	}
}

func (e *Edge) readyValue() float64 {
	if code, _ := e.ready().Answer(); code == http.StatusOK && e.serving.Load() {
		return 1
	}
	return 0
}
