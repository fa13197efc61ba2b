// Package rlsd is `edge rls`: Envoy's rate limit service alone, without
// the proxy, configured by envoyproxy/ratelimit's own environment
// variables (Settings) so that its container runs this binary unchanged.
//
// It serves the gRPC API (internal/rls) on GRPC_HOST:GRPC_PORT, the
// reference's /healthcheck and /json on HOST:PORT, Prometheus metrics on
// DEBUG_HOST:DEBUG_PORT (and on PROMETHEUS_ADDR with USE_PROMETHEUS), and
// the reference's per-descriptor counters through statsd (USE_STATSD) or
// Prometheus. The configuration directory is
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, re-read when it
// changes. Only these unprefixed variables are read, and only here: the
// proxy reads EDGEGUARD_* ones.
package rlsd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/credentials"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Timings of a stop and of the directory watch.
const (
	// DefaultDrainDelay is how long health says NOT_SERVING, still
	// answering calls, before the listeners close, for Envoy's health
	// checks and balancers to move away (EDGEGUARD_DRAIN_DELAY, as the
	// edge's --drain-delay).
	DefaultDrainDelay = 5 * time.Second
	// StopTimeout bounds the calls in flight once the drain is over.
	StopTimeout = 10 * time.Second
	// WatchEvery is how often the configuration directory is looked at.
	WatchEvery = time.Second
	// GCPercent is the service's GOGC unless the environment sets one.
	GCPercent = 400
)

// Main runs the service until SIGTERM or SIGINT, then drains; a second
// signal ends the drain at once. It returns the exit code: 0 after a
// drain, 1 when the service could not start or failed, 2 on a bad
// setting or argument.
func Main(args, environ []string, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
			fmt.Fprintln(stderr, usage)
			return 0
		}
		fmt.Fprintf(stderr, "edge rls takes no argument (got %q): it reads envoyproxy/ratelimit's environment variables\n\n%s\n", args, usage)
		return 2
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	cut, cutDrain := context.WithCancel(context.Background())
	defer stop()
	defer cutDrain()
	go func() {
		<-sigs
		stop()
		<-sigs
		cutDrain()
	}()
	return Run(ctx, cut, environ, stderr)
}

const usage = `usage: edge rls

Serves Envoy's rate limit service alone (no proxy), configured as
envoyproxy/ratelimit is: REDIS_*, RUNTIME_*, HOST/PORT (/healthcheck,
/json), GRPC_HOST/GRPC_PORT, DEBUG_HOST/DEBUG_PORT (/metrics), USE_STATSD,
USE_PROMETHEUS, LOG_LEVEL... See docs/envoy.md, "Service-only mode".`

// Run serves until ctx is done, then drains (health NOT_SERVING for the
// drain delay, or until cut is done) and stops; it returns the exit code
// as Main does.
func Run(ctx, cut context.Context, environ []string, stderr io.Writer) int {
	s, err := FromEnv(environ)
	if err != nil {
		fmt.Fprintf(stderr, "edge rls: %v\n", err)
		return 2
	}
	log := newLogger(stderr, s.LogLevel, s.LogFormat)
	if _, set := newEnv(environ).vars["GOGC"]; !set {
		// The service's live heap is small (the configuration, the
		// over-limit cache, connection buffers) and every call allocates,
		// so at Go's default of 100 the collector runs many times a second
		// and takes about a tenth of the CPU. GOGC set wins.
		debug.SetGCPercent(GCPercent)
	}
	svc, err := start(s, environ, log)
	if err != nil {
		log.Error("rate limit service refused to start", "err", err)
		return 1
	}
	err = svc.serve(ctx, cut)
	svc.close()
	if err != nil {
		log.Error("rate limit service failed", "err", err)
		return 1
	}
	log.Info("rate limit service stopped")
	return 0
}

// newLogger takes the reference's level names (trace, debug, info, warn,
// warning, error, fatal, panic; any case) and formats (text, json).
func newLogger(w io.Writer, level, format string) *slog.Logger {
	var l slog.Level
	switch strings.ToLower(level) {
	case "trace", "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "error", "fatal", "panic":
		l = slog.LevelError
	default:
		l = slog.LevelWarn
	}
	o := &slog.HandlerOptions{Level: l}
	if strings.EqualFold(format, "json") {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// service is one running `edge rls`.
type service struct {
	s       Settings
	log     *slog.Logger
	dir     string
	srv     *rls.Server
	grpc    *rls.GRPC
	grpcLn  net.Listener
	http    []*http.Server
	httpLns []net.Listener
	statsd  *statsdSink
	serving atomic.Bool
	closers []func()
}

func start(s Settings, environ []string, log *slog.Logger) (_ *service, err error) {
	svc := &service{s: s, log: log, dir: s.ConfigDir()}
	defer func() {
		if err != nil {
			svc.close()
		}
	}()
	if len(s.Unsupported) > 0 {
		log.Warn("envoyproxy/ratelimit settings not supported by edge rls are ignored", "variables", s.Unsupported)
	}
	if ps := PerSecondVars(environ); len(ps) > 0 {
		log.Warn("a second Redis for per-second limits is not needed: every limit counts in the Redis of REDIS_URL", "variables", ps)
	}
	if s.RedisPipelineWindow > 0 || s.RedisPipelineLimit > 0 {
		log.Info("REDIS_PIPELINE_WINDOW and REDIS_PIPELINE_LIMIT tune nothing: concurrent calls for one Redis node are always sent together, without a window")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	l, err := svc.buildLimiter(reg)
	if err != nil {
		return nil, err
	}
	if s.UseStatsd {
		addr := net.JoinHostPort(s.StatsdHost, strconv.Itoa(s.StatsdPort))
		if svc.statsd, err = newStatsdSink(addr, log); err != nil {
			return nil, fmt.Errorf("statsd at %s: %w", addr, err)
		}
		svc.closers = append(svc.closers, svc.statsd.close)
	}
	var promReg prometheus.Registerer
	if s.UsePrometheus {
		promReg = reg
	}
	var observer func(rls.Observation)
	if s.UseStatsd || s.UsePrometheus {
		ds, err := newDescriptorStats(s.NearLimitRatio, promReg, svc.statsd)
		if err != nil {
			return nil, err
		}
		observer = ds.Observe
	}
	opt := rls.Options{Limiter: l, Shadow: s.ShadowMode, Quota: s.QuotaMode, Observer: observer}
	if s.LimitResponseHeadersEnabled {
		opt.Headers = rls.HeadersLegacy
		opt.LegacyNames.Limit, opt.LegacyNames.Remaining, opt.LegacyNames.Reset = s.LimitHeader, s.RemainingHeader, s.ResetHeader
	}
	if svc.srv, err = rls.New(opt, reg, log); err != nil {
		return nil, err
	}
	if err := svc.reload(); err != nil {
		return nil, fmt.Errorf("loading the configuration: %w", err)
	}
	log.Info("rate limit configuration loaded", "dir", svc.dir, "domains", len(svc.srv.Config().Domains()))

	var creds credentials.TransportCredentials
	if s.GRPCServerUseTLS {
		tc, err := rls.TLSConfig(s.GRPCServerTLSCert, s.GRPCServerTLSKey, s.GRPCClientTLSCACert)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	svc.grpc = rls.NewGRPC(svc.srv, rls.GRPCOptions{Creds: creds})
	addr := net.JoinHostPort(s.GRPCHost, strconv.Itoa(s.GRPCPort))
	if svc.grpcLn, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("gRPC listener: %w", err)
	}
	svc.closers = append(svc.closers, func() { _ = svc.grpcLn.Close() })

	main := http.NewServeMux()
	main.HandleFunc("/healthcheck", svc.healthcheck)
	main.Handle("/json", jsonHandler(svc.srv, log))
	debug := http.NewServeMux()
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	debug.Handle("/metrics", metrics)
	if err := svc.listenHTTP(net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), main); err != nil {
		return nil, err
	}
	if err := svc.listenHTTP(net.JoinHostPort(s.DebugHost, strconv.Itoa(s.DebugPort)), debug); err != nil {
		return nil, err
	}
	if s.UsePrometheus {
		pm := http.NewServeMux()
		pm.Handle(s.PrometheusPath, metrics)
		if err := svc.listenHTTP(s.PrometheusAddr, pm); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

func (svc *service) buildLimiter(reg prometheus.Registerer) (*limiter.Limiter, error) {
	url, mode, err := svc.s.Redis()
	if err != nil {
		return nil, err
	}
	limiter.LogRedisTo(svc.log)
	// As the reference: a call Redis cannot decide is a gRPC error
	// (UNAVAILABLE), and Envoy's failure_mode_deny decides. A local
	// fallback would admit the whole limit in every replica: this mode
	// does not know how many share the Redis. REDIS_TIMEOUT bounds a
	// decision's wait on Redis as it bounds the reference's I/O (the
	// caller's own deadline, Envoy's timeout, ends it sooner).
	op, err := limiter.Open(limiter.OpenOptions{URL: url, Mode: mode, Autopipeline: true, KeyPrefix: svc.s.CacheKeyPrefix,
		Config: limiter.Config{FailMode: limiter.FailClosed, Timeout: svc.s.RedisTimeout}, Log: svc.log}, reg)
	if errors.Is(err, limiter.ErrRedisTooOld) {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("redis (REDIS_*, CACHE_KEY_PREFIX): %w", err)
	}
	svc.closers = append(svc.closers, op.Close) // the limiter, then the client (closers run in reverse)
	if op.LoadErr != nil {
		svc.log.Warn("redis not reachable at start; answering UNAVAILABLE until it is", "err", op.LoadErr)
	}
	l := op.Limiter
	svc.log.Info("counting in redis", "mode", mode, "type", svc.s.RedisType, "socket", svc.s.RedisSocketType)
	return l, nil
}

func (svc *service) listenHTTP(addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("HTTP listener: %w", err)
	}
	svc.httpLns = append(svc.httpLns, ln)
	svc.http = append(svc.http, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute})
	svc.closers = append(svc.closers, func() { _ = ln.Close() })
	return nil
}

// reload loads the configuration directory (its symlinks resolved, so a
// Kubernetes volume's swapped ..data link is followed).
func (svc *service) reload() error {
	dir, err := filepath.EvalSymlinks(svc.dir)
	if err != nil {
		return err
	}
	return svc.srv.Reload(dir, svc.s.MergeDomainConfig)
}

// setServing sets gRPC health and /healthcheck together.
func (svc *service) setServing(ok bool) {
	svc.serving.Store(ok)
	svc.grpc.SetServing(ok)
}

// healthcheck answers as the reference's: 200 "OK" while serving, 500
// with an empty body otherwise.
func (svc *service) healthcheck(w http.ResponseWriter, _ *http.Request) {
	if !svc.serving.Load() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	_, _ = w.Write([]byte("OK"))
}

func (svc *service) serve(ctx, cut context.Context) error {
	errc := make(chan error, 1+len(svc.http))
	var wg sync.WaitGroup
	wg.Add(1 + len(svc.http))
	go func() {
		defer wg.Done()
		if err := svc.grpc.Serve(svc.grpcLn); err != nil {
			errc <- fmt.Errorf("gRPC: %w", err)
		}
	}()
	for i, hs := range svc.http {
		go func() {
			defer wg.Done()
			if err := hs.Serve(svc.httpLns[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("HTTP: %w", err)
			}
		}()
	}
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	go svc.watch(wctx)
	sctx, stopStats := context.WithCancel(context.Background())
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		if svc.statsd != nil {
			svc.statsd.run(sctx, svc.s.StatsFlushInterval)
		}
	}()
	svc.setServing(true)
	svc.log.Info("rate limit service serving", "grpc", svc.grpcLn.Addr().String(), "http", svc.httpLns[0].Addr().String(), "debug", svc.httpLns[1].Addr().String())

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	// Drain: NOT_SERVING at once, calls still answered for the drain
	// delay (cut short by cut or a failed listener), then the calls in
	// flight get StopTimeout.
	svc.setServing(false)
	if err == nil {
		svc.log.Info("draining", "delay", svc.s.DrainDelay.String())
		t := time.NewTimer(svc.s.DrainDelay)
		select {
		case <-t.C:
		case <-cut.Done():
			t.Stop()
		case err = <-errc:
			t.Stop()
		}
	}
	stopWatch()
	sctx2, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	svc.grpc.Stop(sctx2)
	for _, hs := range svc.http {
		if hs.Shutdown(sctx2) != nil {
			_ = hs.Close()
		}
	}
	wg.Wait()
	stopStats()
	<-statsDone
	return err
}

// watch re-reads the configuration when the watched directory changes:
// a file added, removed, written, or a symlink moved. A set that does not
// load is logged and the configuration in force stays.
func (svc *service) watch(ctx context.Context) {
	t := time.NewTicker(WatchEvery)
	defer t.Stop()
	last := fingerprint(svc.s.WatchDir())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp := fingerprint(svc.s.WatchDir())
		if fp == last {
			continue
		}
		last = fp
		if err := svc.reload(); err != nil {
			svc.log.Error("rate limit configuration reload refused; keeping the one in force", "err", err)
			continue
		}
		svc.log.Info("rate limit configuration reloaded", "domains", len(svc.srv.Config().Domains()))
	}
}

// fingerprint sums up a directory tree: every entry's path, symlink
// target, size and modification time.
func fingerprint(root string) string {
	var b strings.Builder
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			b.WriteString("!" + path + "\n")
			return nil
		}
		b.WriteString(path)
		if d.Type()&os.ModeSymlink != 0 {
			t, _ := os.Readlink(path)
			b.WriteString(" -> " + t)
		}
		if fi, err := os.Stat(path); err == nil {
			fmt.Fprintf(&b, " %d %d", fi.Size(), fi.ModTime().UnixNano())
		}
		b.WriteByte('\n')
		return nil
	})
	if t, err := filepath.EvalSymlinks(root); err == nil && t != root {
		// A symlinked root: walk where it points.
		b.WriteString("=" + t + "\n" + fingerprint(t))
	}
	return b.String()
}

func (svc *service) close() {
	for i := len(svc.closers) - 1; i >= 0; i-- {
		svc.closers[i]()
	}
	svc.closers = nil
}
