package listen

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// Settings are the public listeners' and server's settings.
type Settings struct {
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration // per write (perWrite), never per response
	IdleTimeout    time.Duration
	MaxHeaderBytes int
	MaxBodyBytes   int
	// ProxyFrom are the balancers a PROXY header is taken from (none: the
	// PROXY protocol is off); Trusted the proxies the per-client cap
	// looks past.
	ProxyFrom, Trusted trust.Set
	MaxConnsPerIP      int
	IPv6Prefix         int
	Listen             string // --listen
	ListenTLS          string // --listen-tls ("" none)
	H2MaxStreams       int    // 0: no HTTP/2 on the TLS listener
	H2MaxHeldBytes     int64
	Certs              CertsConfig
}

// Public opens the public listeners: each gets the per-write deadline,
// the PROXY protocol policy and the per-client cap, which they share.
type Public struct {
	s      Settings
	m      *Metrics
	log    *slog.Logger
	counts *ConnCounts
}

// NewPublic is the public listeners' accept stack under s.
func NewPublic(s Settings, m *Metrics, log *slog.Logger) *Public {
	return &Public{s: s, m: m, log: log,
		counts: NewConnCounts(s.MaxConnsPerIP, s.IPv6Prefix, s.Trusted, m.ConnsRefused)}
}

// Stack puts the per-write deadline, the PROXY protocol policy and the
// per-client cap over a public listener; refusal is what a refused
// connection is told.
func (p *Public) Stack(ln net.Listener, refusal []byte) net.Listener {
	// Innermost: every write to the socket, TLS records included, has its
	// own --write-timeout.
	ln = perWrite(ln, p.s.WriteTimeout)
	if len(p.s.ProxyFrom) > 0 {
		ln = NewProxyListener(ln, p.s.ProxyFrom, p.s.ReadTimeout, p.m.ProxyRefused, p.log)
	}
	return Capped(ln, p.counts, refusal)
}

// NewServer is the public fasthttp server, its handler the request
// pipeline.
func (p *Public) NewServer(handler fasthttp.RequestHandler, onError func(*fasthttp.RequestCtx, error), expect func(*fasthttp.RequestCtx) int) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:        handler,
		Name:           "edgeguard",
		ReadBufferSize: p.s.MaxHeaderBytes,
		// Bodies are streamed: the handler runs once the header and at
		// most 8 KiB of body are in, sheds and limits, and the proxy reads
		// the rest while sending it to the origin. Buffering whole bodies
		// let a client's declared Content-Length reserve memory it never
		// sent. With streaming, fasthttp no longer enforces the size:
		// screen refuses a declared length above it, the proxy a chunked
		// body that grows past it.
		StreamRequestBody:  true,
		MaxRequestBodySize: p.s.MaxBodyBytes,
		ErrorHandler:       onError,
		ExpectHandler:      expect,
		CloseOnShutdown:    true,
		ReadTimeout:        p.s.ReadTimeout,
		// No WriteTimeout: fasthttp's is one deadline for the whole
		// response, which would cut a streamed body (a large object, an
		// event stream) however well its client reads. --write-timeout
		// is a deadline per write instead (perWrite, in Stack).
		IdleTimeout:                  p.s.IdleTimeout,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                false,
		Logger:                       fastHTTPLogger{Log: p.log},
	}
}

// TLS termination on --listen-tls: TLS 1.2 and 1.3, AEAD suites only for
// 1.2, HTTP/2 and HTTP/1.1 by ALPN (h2.go), no 0-RTT (crypto/tls has
// none). The listener is the edge's own (fasthttp's ServeTLS clones the
// config), so the session-ticket keys stay the edge's to set. Certificates
// come from a certstore, re-scanned every certPoll: a changed file is
// served from the next handshake on, connections already open keep theirs.

// TLS is the TLS listener and what serves on it.
type TLS struct {
	Ln    net.Listener
	Certs *Certs
	H2    *H2Server // nil without HTTP/2
}

// Addr is the bound address; "" for a nil TLS (no TLS listener).
func (t *TLS) Addr() string {
	if t == nil {
		return ""
	}
	return t.Ln.Addr().String()
}

// Certificates and HTTP2 are the certificates and the HTTP/2 server; nil
// for a nil TLS (HTTP2 nil without HTTP/2 too).
func (t *TLS) Certificates() *Certs {
	if t == nil {
		return nil
	}
	return t.Certs
}

func (t *TLS) HTTP2() *H2Server {
	if t == nil {
		return nil
	}
	return t.H2
}

// OpenTLS builds the TLS listener: the certificates, then TCP (bind),
// the PROXY protocol policy, the per-client cap, and TLS. With HTTP/2,
// server hands its h2 connections to the HTTP/2 server. consul says the
// certificates may come from Consul (none on disk is no error then).
func (p *Public) OpenTLS(bind func() (net.Listener, error), server *fasthttp.Server, consul bool) (*TLS, error) {
	s := p.s
	certs, err := newCerts(s.Certs, p.m.Certs, p.log)
	if err != nil {
		return nil, err
	}
	if certs.Len() == 0 && !consul {
		return nil, errors.New("listen-tls: no valid certificate in --tls-cert-dir or --tls-default-cert")
	}
	ln, err := bind()
	if err != nil {
		return nil, fmt.Errorf("listening on %s (TLS): %w", s.ListenTLS, err)
	}
	tlsConfig, err := certs.TLSConfig(s.H2MaxStreams > 0)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	t := &TLS{Certs: certs}
	if s.H2MaxStreams > 0 {
		t.H2 = newH2Server(h2Config{
			Addr:           ln.Addr(),
			Handler:        server.Handler,
			Counts:         p.counts,
			Log:            p.log,
			Metrics:        p.m.H2,
			StreamMetrics:  p.m.H2Streams,
			MaxStreams:     s.H2MaxStreams,
			MaxHeldBytes:   s.H2MaxHeldBytes,
			MaxHeaderBytes: s.MaxHeaderBytes,
			ReadTimeout:    s.ReadTimeout,
			WriteTimeout:   s.WriteTimeout,
			IdleTimeout:    s.IdleTimeout,
		})
		server.NextProto("h2", h1Unwrapped(t.H2.ServeConn))
	}
	t.Ln = newTLSListener(p.Stack(ln, nil), tlsConfig, p.m.TLS, s.ReadTimeout, p.log)
	return t, nil
}
