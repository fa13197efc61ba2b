package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// Server is the admin server (newHandler) on its own listener.
type Server struct {
	Ln  net.Listener
	srv *http.Server
}

// newServer is the admin server of c on ln, which the caller bound (so
// that an upgrade can hand it over).
func newServer(c Config, ln net.Listener) *Server {
	return &Server{Ln: ln, srv: &http.Server{Handler: newHandler(c), ReadHeaderTimeout: 5 * time.Second}}
}

// Open is newServer on --admin, bound through bind, showing the edge's
// region and PoP and guarding /debug with --admin-token (pprof with
// --pprof). It registers with reg the series read at scrape
// (registerServing): open is the public server's open connections.
func Open(cfg config.Config, c Config, reg prometheus.Registerer, open func() float64, bind func(addr string) (net.Listener, error)) (*Server, error) {
	if err := registerServing(reg, open, c.Ready); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	ln, err := bind(cfg.Admin)
	if err != nil {
		return nil, fmt.Errorf("listening on %s (admin): %w", cfg.Admin, err)
	}
	c.Region, c.PoP, c.Token, c.Pprof = cfg.Region, cfg.PoP, cfg.AdminToken, cfg.Pprof
	return newServer(c, ln), nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.Ln.Addr().String() }

// Close closes the listener (the edge's closers, when it fails to start).
func (s *Server) Close() { _ = s.Ln.Close() }

// Serve serves until Shutdown, after which it returns nil.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.Ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server, letting the requests in flight finish
// within ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
