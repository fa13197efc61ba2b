package admin

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Server is the admin server (Handler) on its own listener.
type Server struct {
	Ln  net.Listener
	srv *http.Server
}

// NewServer is the admin server of c on ln, which the caller bound (so
// that an upgrade can hand it over).
func NewServer(c Config, ln net.Listener) *Server {
	return &Server{Ln: ln, srv: &http.Server{Handler: Handler(c), ReadHeaderTimeout: 5 * time.Second}}
}

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
