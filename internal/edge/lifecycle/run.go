// Package lifecycle runs a built edge: it serves, re-reads its files on
// SIGHUP, hands its sockets to a new binary on SIGUSR2 (package handoff),
// and when asked to stop, when a server fails or once a new binary took
// over, it drains and shuts the servers down in order (Shutdown). Run owns
// every goroutine it starts: none is left when it returns.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
)

// Plan is what Run runs: the edge's servers and the few hooks into its
// parts that the lifecycle needs.
type Plan struct {
	// Front is the public side (nil: none): its servers come first, its
	// certificates are watched, and its listeners close once it drained.
	Front *listen.Front
	// Background runs until Run returns (the samplers, the certificate
	// watch): they keep working while the edge drains.
	Background []func(ctx context.Context)
	Servers    []Server
	Catalog    Catalog // nil without Consul
	// Reopen is called on SIGHUP and SIGUSR1 (the access log), Reload on
	// SIGHUP (the files).
	Reopen func() error
	Reload func()
	// Sockets are the listening sockets handed to a new binary on SIGUSR2.
	Sockets *handoff.Sockets
	// Serving marks the edge as serving, Ready is what /readyz answers
	// 200 to, Drain marks it as draining (not after a hand-over).
	Serving, Drain func()
	Ready          func() bool
	DrainDelay     time.Duration
	Shutdown       Shutdown
	Log            *slog.Logger
	Started        []any // the "edge serving" line's fields after the pid
}

// Server is one server: Serve runs until Shutdown stops it; its error is
// prefixed with Name.
type Server struct {
	Name  string
	Serve func() error
}

// Catalog is the service catalog the edge registers in: Run runs it, and
// stops it first when draining, so a change while draining cannot
// register the edge again after it left.
type Catalog interface {
	Run(ctx context.Context)
	Deregister()
}

// Run serves until ctx is done, then shuts down gracefully: /readyz turns
// 503 at once, the drain delay lets load balancers notice, the listeners
// close, and in-flight requests finish (within the shutdown timeout).
func Run(ctx context.Context, p Plan) error {
	p.addFront()
	var wg sync.WaitGroup
	// Stopped last, in reverse order of their defers: the sampler keeps
	// shedding while the edge drains.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer wg.Wait()
	defer stopBackground()
	for _, run := range p.Background {
		wg.Go(func() { run(bgCtx) })
	}

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

	// Ready to be counted as serving from here: the listeners are bound,
	// so a connection made from now on is accepted, and no answer can
	// reach a client before the gauge says ready.
	p.Serving()
	errc := serve(&wg, p.Servers)
	var catalogWG sync.WaitGroup
	catalogCtx, stopCatalog := context.WithCancel(context.Background())
	defer catalogWG.Wait()
	defer stopCatalog()
	if p.Catalog != nil {
		catalogWG.Go(func() { p.Catalog.Run(catalogCtx) })
	}
	stopReload := make(chan struct{})
	defer close(stopReload)
	wg.Go(func() { reloadOnSignal(hup, stopReload, p.Reopen, p.Reload, p.Log) })
	handedOver := make(chan struct{})
	wg.Go(func() {
		handoff.UpgradeOnSignal(usr2, stopReload, handedOver, p.Sockets.Exe, p.Sockets.Bound, p.Log)
	})
	if p.Sockets.Inherited.Upgrading() {
		wg.Go(func() { p.Sockets.Inherited.TellWhenReady(ctx, p.Ready, p.Log) })
	} else if err := handoff.Notify(handoff.ReadyState(false)); err != nil {
		p.Log.Warn("service manager not told the edge is ready", "err", err)
	}
	p.Log.Info("edge serving", append([]any{"pid", os.Getpid()}, p.Started...)...)

	var serveErr error
	upgraded := false
	select {
	case serveErr = <-errc:
		p.Log.Error("server failed; shutting down", "err", serveErr)
	case <-ctx.Done():
	case <-handedOver:
		// The new edge serves the same sockets: nothing for load balancers
		// or the catalog to notice, so no drain delay, no 503 on /readyz,
		// no deregistration (the new edge holds the same registration).
		upgraded = true
	}
	if !upgraded {
		p.Drain()
	}
	if p.Catalog != nil {
		stopCatalog()
		catalogWG.Wait()
		if !upgraded {
			p.Catalog.Deregister()
		}
	}
	if serveErr == nil && !upgraded {
		p.Log.Info("draining", "delay", p.DrainDelay)
		time.Sleep(p.DrainDelay)
	}
	err := p.Shutdown.Run()
	p.Log.Info("edge stopped", "err", err)
	return errors.Join(serveErr, err)
}

// addFront adds the public side's servers, its certificate watch and its
// shutdown to the plan.
func (p *Plan) addFront() {
	f := p.Front
	if f == nil {
		return
	}
	front := []Server{{Name: "public server", Serve: f.Serve}}
	p.Shutdown.Public, p.Shutdown.Quiet = f.Server.ShutdownWithContext, f.Quiet.CloseIdle
	p.Shutdown.Listeners = append(p.Shutdown.Listeners, f.Ln)
	if f.TLS != nil {
		front = append(front, Server{Name: "public TLS server", Serve: f.ServeTLS})
		p.Background = append(p.Background, f.TLS.Certs.Watch)
		p.Shutdown.Listeners = append(p.Shutdown.Listeners, f.TLS.Ln)
	}
	if h2 := f.TLS.HTTP2(); h2 != nil {
		front = append(front, Server{Name: "public HTTP/2 server", Serve: h2.Serve})
		p.Shutdown.HTTP2 = h2.Shutdown
	}
	p.Servers = append(front, p.Servers...)
}

// serve runs the servers on wg until they are shut down; the first that
// fails says why on the channel returned.
func serve(wg *sync.WaitGroup, servers []Server) <-chan error {
	errc := make(chan error, len(servers))
	for _, s := range servers {
		wg.Go(func() {
			if err := s.Serve(); err != nil {
				errc <- fmt.Errorf("%s: %w", s.Name, err)
			}
		})
	}
	return errc
}

// reloadOnSignal calls reopen on every signal and reload on every SIGHUP,
// until stop is closed.
func reloadOnSignal(sig <-chan os.Signal, stop <-chan struct{}, reopen func() error, reload func(), log *slog.Logger) {
	for {
		select {
		case s := <-sig:
			if err := reopen(); err != nil {
				log.Error("access log not reopened; writing to the old file", "err", err)
			}
			if s == syscall.SIGHUP {
				reload()
			}
		case <-stop:
			return
		}
	}
}
