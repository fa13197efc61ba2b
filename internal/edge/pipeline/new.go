package pipeline

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/accesslog"
	"github.com/edgeguard/edgeguard/internal/edge/bhlayer"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/logevery"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Pipeline is the request path of one edge node: its stages, what they
// count and what they log.
type Pipeline struct {
	cfg          Config
	log          *slog.Logger
	metrics      *metrics
	trusted      trust.Set
	headerScreen trust.Screen
	allowMethods map[string]bool
	popKeyPrefix string

	bh       *bhlayer.Layer
	shed     *shedder.Shedder
	workers  *shedder.Workers
	route    func(host string) (*origin.Proxy, hosts.PathPolicy, string)
	tunnels  *origin.Tunnels // nil: upgrades are proxied as plain requests
	draining *atomic.Bool    // the edge is draining: every response closes its connection
	conns    Conns

	limits
	records
	closers []func()
}

// limits are what the checks and the limiter's answers need.
type limits struct {
	limiter               *limiter.Limiter
	penalties             *limiter.PenaltyBox // the rules' penalties (escapes.go)
	storeName             string
	counter               *responseCounter                // counts by the response (response.go)
	rules                 *atomic.Pointer[rules.Snapshot] // the rules in force
	nodesRegion, nodesPoP *atomic.Int64                   // fallback divisors: flags, then the catalog
	enforce               atomic.Pointer[enforcement]     // nil: enforce every key
}

// records are where requests are written down besides the metrics.
type records struct {
	access     *accesslog.Log // nil: off
	tracing    *tracing       // nil: off
	accessWarn logevery.Gate

	// seen, when set (tests), is told what the rules saw of each request
	// about to be proxied, and its request id.
	seen func(ctx *fasthttp.RequestCtx, req *rules.Request, requestID string)
}

// Config is what the pipeline reads of the edge's settings (package
// config's fields of the same names).
type Config struct {
	Region, PoP               string
	TrustedProxies            []netip.Prefix
	IPv6Prefix                int // an IPv6 client's identity is its prefix (0: 64)
	AllowUnderscoresInHeaders bool
	AllowMethods              []string
	DefaultHost               string
	TLSCheckHost              bool // 421 for a Host the connection's certificate does not cover
	MaxBodyBytes              int
	LegacyHeaders             bool
	AccessLog                 string
	AccessLogFormat           string
	AccessLogSample           float64
	OTLPEndpoint              string
	TraceSampleRatio          float64

	// RefusedMethod is the request's method when the edge refuses it
	// unless AllowMethods has it, else ""; UsableHost says whether a Host
	// can name a site (package config's). RefusedMethod takes the request,
	// not its method: fasthttp's default method is a fresh slice that
	// would escape to the heap through a func value.
	RefusedMethod func(ctx *fasthttp.RequestCtx) string
	UsableHost    func(host []byte) bool
}

// Limits are the rate limiting parts the pipeline decides with.
type Limits struct {
	Limiter   *limiter.Limiter
	Penalties *limiter.PenaltyBox
	StoreName string // the store's name in metrics and logs
	// Rules is the rules in force; the edge swaps them.
	Rules *atomic.Pointer[rules.Snapshot]
	// NodesRegion and NodesPoP divide limits in the local fallback; the
	// edge updates them.
	NodesRegion, NodesPoP *atomic.Int64
}

// Parts are the other parts of the edge the pipeline sends requests
// through.
type Parts struct {
	Behaviour *bhlayer.Layer
	Shedder   *shedder.Shedder
	Workers   *shedder.Workers
	// Route is the origin pool of a host, normalised as the rules
	// normalise it (the host table; the --origin pool for the rest), how
	// the host's paths are read (its path policy), and its tenant: the
	// name of the share of the workers it is held to (hostroute's Route).
	Route func(host string) (_ *origin.Proxy, _ hosts.PathPolicy, tenant string)
	// Tunnels carries upgrades (WebSocket); nil strips Upgrade instead.
	Tunnels *origin.Tunnels
	// Draining is set while the edge drains.
	Draining *atomic.Bool
	// Conns are what the listeners know of a request's connection.
	Conns Conns
	// AccessLogRegistry registers the access log's metrics (the edge's
	// registry, without the region labels reg may add).
	AccessLogRegistry prometheus.Registerer
}

// Conns are what the listeners (package listen) know of a request's
// connection, and the refusals of their framing reader.
type Conns struct {
	JA4 func(c net.Conn) string // the client's TLS fingerprint ("" without one)
	// CertCovers says whether the certificate served on c covers host
	// (true on a plain connection).
	CertCovers  func(c net.Conn, host string) bool
	Gone        func(c net.Conn) bool // the client has left
	Sent        func(c net.Conn) bool // the client sent anything on c
	ClosesAfter func(c net.Conn) bool // c closes after this response
	// Framing is the refusal of a request whose framing the reader
	// refused (ok false for any other error); FramingReasons are every
	// reason it gives.
	Framing        func(err error) (reason string, status int, detail string, ok bool)
	FramingReasons []string
}

// New builds the pipeline: it registers its metrics with reg and opens
// the access log and the tracer, if configured. Close releases them.
func New(cfg Config, log *slog.Logger, lim Limits, parts Parts, reg prometheus.Registerer) (*Pipeline, error) {
	p := &Pipeline{
		cfg:          cfg,
		log:          log,
		trusted:      trust.Set(cfg.TrustedProxies),
		headerScreen: trust.Screen{AllowUnderscores: cfg.AllowUnderscoresInHeaders},
		popKeyPrefix: "pop." + cfg.PoP + ".",
		allowMethods: map[string]bool{},
		bh:           parts.Behaviour,
		shed:         parts.Shedder,
		workers:      parts.Workers,
		route:        parts.Route,
		tunnels:      parts.Tunnels,
		draining:     parts.Draining,
		conns:        parts.Conns,
		limits: limits{
			limiter:     lim.Limiter,
			penalties:   lim.Penalties,
			storeName:   lim.StoreName,
			rules:       lim.Rules,
			nodesRegion: lim.NodesRegion,
			nodesPoP:    lim.NodesPoP,
		},
	}
	for _, m := range cfg.AllowMethods {
		p.allowMethods[m] = true
	}
	var err error
	if p.metrics, err = newMetrics(reg, parts.Conns.FramingReasons); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	p.counter = newResponseCounter()
	p.closers = append(p.closers, p.counter.wait) // before the limiter closes
	if err := p.openAccessLog(parts.AccessLogRegistry); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.startTracing(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close waits for the response counts in flight, and closes the access
// log and the tracer.
func (e *Pipeline) Close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

// ReopenAccessLog reopens the access log's file (log rotation); on error
// the old file stays in use.
func (e *Pipeline) ReopenAccessLog() error {
	return e.access.Reopen()
}

// SetSeen sets a func (tests) told what the rules saw of each request
// about to be proxied, and its request id. Set it before the first
// request.
func (e *Pipeline) SetSeen(seen func(ctx *fasthttp.RequestCtx, req *rules.Request, requestID string)) {
	e.seen = seen
}
