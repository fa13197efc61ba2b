package listen

import (
	"fmt"
	"net"

	"github.com/valyala/fasthttp"
)

// Front is the edge's public side: the fasthttp server and its plain
// listener, and with --listen-tls the TLS listener and its HTTP/2 server.
// Quiet holds the public connections that have sent nothing yet.
type Front struct {
	Server *fasthttp.Server
	Ln     net.Listener // the plain listener, stacked (Stack)
	TLS    *TLS         // nil without --listen-tls
	Quiet  *Quiet
}

// Bind opens a listener on an address (the edge's: an inherited socket,
// or a new one).
type Bind func(addr string) (net.Listener, error)

// OpenFront builds the public server (NewServer) and binds its listeners
// on --listen and --listen-tls, through public and tls; consul says the
// certificates may come from Consul alone (OpenTLS).
func (p *Public) OpenFront(handler fasthttp.RequestHandler, onError func(*fasthttp.RequestCtx, error), expect func(*fasthttp.RequestCtx) int, public, tls Bind, consul bool) (*Front, error) {
	f := &Front{Server: p.NewServer(handler, onError, expect), Quiet: newQuiet()}
	ln, err := public(p.s.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", p.s.Listen, err)
	}
	f.Ln = p.Stack(ln, []byte(TooManyConns))
	if p.s.ListenTLS != "" {
		if f.TLS, err = p.OpenTLS(func() (net.Listener, error) { return tls(p.s.ListenTLS) }, f.Server, consul); err != nil {
			_ = f.Ln.Close()
			return nil, err
		}
	}
	return f, nil
}

// Close closes the listeners.
func (f *Front) Close() {
	_ = f.Ln.Close()
	if f.TLS != nil {
		_ = f.TLS.Ln.Close()
	}
}

// Addr is the plain listener's bound address.
func (f *Front) Addr() string { return f.Ln.Addr().String() }

// Serve serves the plain listener, ServeTLS the TLS one (as HTTP/1.x; the
// HTTP/2 server takes the connections that negotiate h2).
func (f *Front) Serve() error    { return f.Server.Serve(Framed(f.Ln, f.Quiet)) }
func (f *Front) ServeTLS() error { return f.Server.Serve(Framed(f.TLS.Ln, f.Quiet)) }
