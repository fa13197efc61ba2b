// Package origin is the last step of the edge's request path: it forwards an
// admitted request to one of the origin servers and copies the answer back.
//
// A Proxy is one pool of origins; an edge serving several sites builds
// one per pool, all counting into one Metrics under their pool label.
//
// Each origin gets its own fasthttp.HostClient (pooled keep-alive
// connections, dial and deadline handling, body size limit). Balancing and
// health are ours rather than fasthttp.LBClient's: LBClient only penalises a
// failing client for a few seconds and exposes no state, while the edge
// needs a real in/out-of-rotation view (for Healthy, readiness and the
// healthy gauge), a consecutive-failure threshold, and re-admission by an
// active check or by a request once an ejection is over.
//
// One Serve call:
//  1. copies the client request (its request line as received, path and
//     query byte for byte), strips hop-by-hop headers (the fixed list and
//     every header named in Connection, plus Expect, which the edge's
//     server has already answered) and adds its hop: X-Forwarded-For,
//     Forwarded, X-Forwarded-Proto and -Host (a trusted peer's kept,
//     anyone else's written from the connection) and X-Request-ID;
//  2. picks an ejected origin whose ejection is over (on probation: one
//     request tries it, and its answer decides), else the least-loaded
//     healthy origin; when none is healthy it still tries the one that
//     failed longest ago, since the health view may be stale and a try
//     costs at most one dial, where refusing would turn a flapping check
//     into a full outage;
//  3. sends the request with a deadline for the response header
//     (HeaderTimeout, or Timeout when that comes first), over TLS for an
//     https origin (tls.go: verified, the handshake part of connecting); a
//     failed dial or handshake (nothing of the request was sent, so any
//     method is safe to resend) is retried once on another origin within
//     the same deadline, and nothing else is: a request that reached an
//     origin is never sent to a second one;
//  4. strips hop-by-hop headers from the origin's response and hands it to
//     the client, or answers 502/504 with an application/problem+json body
//     that never carries origin addresses or error text (those go to the
//     log). A body of up to 64 KiB with a declared length is read whole
//     first, as a plain body (and one of unknown length for an HTTP/1.0
//     client, which cannot take it chunked, up to 64 MiB); any other
//     streams (stream.go): Serve returns
//     with the header, and the server copies the body as it arrives, each
//     read flushed to the client, so no size is too large, server-sent
//     events arrive as sent, and a client that stops reading stops the
//     origin. Once the header is in, each read of the body waits at most
//     ReadIdleTimeout (conn.go): a stream lives as long as it moves.
package origin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/reqhead"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Proxy forwards requests to a fixed set of origins. It is safe for
// concurrent use.
type Proxy struct {
	cfg     Config
	origins []*origin
	metrics *metrics
	log     *slog.Logger
	// shared and label are the Metrics the pool counts into and its pool
	// label there, for Close.
	shared *Metrics
	label  string
	// now is the clock of ejections (time.Now but in tests).
	now func() time.Time
	// limit is the pool's concurrency limit; nil: none.
	limit *shedder.PoolLimit

	// next rotates the scan start so equally loaded origins share traffic
	// instead of the first one taking every tie.
	next atomic.Uint32

	stop      chan struct{}
	stopOnce  sync.Once
	checkDone sync.WaitGroup

	// streams are the origin connections whose bodies are streaming, for
	// EndStreams; ended says EndStreams ran (a stream starting later is
	// ended at once).
	streamsMu sync.Mutex
	streams   map[*timedConn]struct{}
	ended     bool
}

// OriginStatus is one origin as the proxy currently sees it.
type OriginStatus struct {
	URL     string
	Healthy bool
}

// New builds a proxy over cfg.URLs with metrics of its own on reg: the
// NewMetrics and NewPool of a single pool. Several pools on one registry
// share one Metrics instead.
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validating origin config: %w", err)
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return NewPool(cfg, m, log)
}

// NewPool builds the pool cfg.Pool over cfg.URLs, counting into m under
// its name, and, unless cfg.HealthCheckInterval is 0, starts checking the
// origins in the background; Close stops the checks and removes the
// pool's series. Every origin starts in rotation. m and log may be nil
// (metrics of its own, unregistered; no log).
func NewPool(cfg Config, m *Metrics, log *slog.Logger) (*Proxy, error) {
	return newPool(cfg, m, log, time.Now)
}

// newPool is NewPool on the clock now, which decides when an ejected
// origin may be tried again (tests walk it forward instead of sleeping).
func newPool(cfg Config, m *Metrics, log *slog.Logger, now func() time.Time) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validating origin config: %w", err)
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m, _ = NewMetrics(nil) // cannot fail unregistered
	}
	p := &Proxy{cfg: cfg, shared: m, log: log, now: now, stop: make(chan struct{}), streams: make(map[*timedConn]struct{}), limit: shedder.NewPoolLimit(cfg.Concurrency)}
	for _, raw := range cfg.URLs {
		u, err := url.Parse(raw) // already checked by Validate
		if err != nil {
			return nil, fmt.Errorf("parsing origin url %q: %w", raw, err)
		}
		o, err := newOrigin(p, raw, u, cfg)
		if err != nil {
			return nil, err
		}
		p.origins = append(p.origins, o)
	}
	if cfg.TLS.InsecureSkipVerify {
		log.Warn("origin TLS certificates are not verified (insecure_skip_verify)", "pool", cfg.Pool)
	}
	p.label, p.metrics = m.open(p, cfg.Pool)
	if cfg.HealthCheckInterval > 0 {
		p.checkDone.Add(1)
		go p.checkLoop()
	}
	return p, nil
}

// Name is the pool's name (Config.Pool, DefaultPool when empty).
func (p *Proxy) Name() string { return p.cfg.Pool }

// origin is one upstream server and what we know about its health.
type origin struct {
	url    string // as configured, so operators recognise it
	host   string // host[:port] as configured, sent as Host when rewriting
	scheme string
	client *fasthttp.HostClient

	healthy atomic.Bool
	// fails counts consecutive failures from real requests and checks
	// alike; any success resets it.
	fails atomic.Int32
	// lastFail (unix nanoseconds) picks the last-resort origin when none
	// is healthy: the one that failed longest ago is likeliest back.
	lastFail atomic.Int64
	// ejectedUntil (unix nanoseconds; 0: not ejected) is when an origin
	// that real requests took out of rotation is on probation: the next
	// request may try it. ejections counts the ejections since it was
	// last in rotation, which lengthen each ejection (ejectionTime).
	ejectedUntil atomic.Int64
	ejections    atomic.Int32
	// probing says a request on probation is under way: its failure, not
	// that of a request sent before the ejection, ejects the origin again.
	probing atomic.Bool

	// conns puts connections back into client's pool; pending counts the
	// exchanges under way (the least-loaded pick).
	conns   connPool
	pending atomic.Int32
	// closed says the pool is closed: connections coming back are closed
	// rather than kept idle.
	closed atomic.Bool

	// logSecond and suppressed keep an outage from turning into one log
	// line per request: at most one failure line per origin per second.
	logSecond  atomic.Int64
	suppressed atomic.Int64
}

func newOrigin(p *Proxy, raw string, u *url.URL, cfg Config) (*origin, error) {
	isTLS := u.Scheme == "https"
	var tlsCfg *tls.Config
	if isTLS {
		var err error
		if tlsCfg, err = clientTLS(cfg.TLS, u); err != nil {
			return nil, err
		}
	}
	dialTimeout := cfg.DialTimeout
	o := &origin{url: raw, host: u.Host, scheme: u.Scheme}
	o.client = &fasthttp.HostClient{
		Addr:  fasthttp.AddMissingPort(u.Host, isTLS),
		IsTLS: isTLS,
		// fasthttp passes the time left until the request deadline (0 for
		// background dials); DialTimeout caps it so a black-holed origin
		// costs one dial timeout, not the whole request budget.
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			if timeout <= 0 || timeout > dialTimeout {
				timeout = dialTimeout
			}
			conn, err := dialTCP(addr, timeout, p.lateConnect)
			if err != nil {
				return nil, &dialError{err: err}
			}
			tc := newTimedConn(conn, cfg.ReadIdleTimeout)
			if tlsCfg == nil {
				return tc, nil
			}
			// The handshake gets the dial's budget again: a TLS origin
			// costs at most two of them before the next one is tried.
			return handshake(tc, tlsCfg, timeout)
		},
		// Used by fasthttp only for a connection the dialer did not
		// already make TLS (none); set so nothing falls back to defaults.
		TLSConfig: tlsCfg,
		MaxConns:  cfg.MaxConnsPerHost,
		// Only the health checks' responses are read whole; the proxied
		// ones stream, which fasthttp never limits.
		MaxResponseBodySize: maxCheckBody,
		// Origins routinely send more header than fasthttp's 4 KiB default
		// (cookies, CSP); a too-small buffer would turn them into 502s.
		ReadBufferSize: 16 << 10,
		// A proxy must not add a User-Agent the client did not send, nor
		// rewrite paths (%2F and friends mean something to the origin).
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		// Errors are logged; they must not carry request or response bodies.
		SecureErrorLogMessage: true,
	}
	o.conns = newHostConns(o.client.ReleaseConn, o.client.CloseConn)
	o.healthy.Store(true)
	return o, nil
}

// errDial matches every dialError. Callers test with errors.Is rather than
// errors.As, which would heap-allocate its target on the request path.
var errDial = errors.New("dialing origin")

// dialError marks a failure to connect: nothing was sent, so the request
// may go to another origin whatever its method.
type dialError struct{ err error }

func (e *dialError) Error() string        { return "dialing origin: " + e.err.Error() }
func (e *dialError) Unwrap() error        { return e.err }
func (e *dialError) Is(target error) bool { return target == errDial }

// exchange is the per-request scratch space, pooled so a proxied request
// allocates nothing of its own in the steady state.
type exchange struct {
	req  fasthttp.Request
	resp fasthttp.Response
	buf  []byte
	body bodyReader
	// kind is what roundTrip left of the response body: none, small (in
	// small, read whole) or a stream, whose connection (cc, conn, its
	// reader br, closeConn: not to be pooled) the exchange holds until
	// stream, the body on its way to the client, is closed.
	kind      bodyKind
	small     []byte
	cc        any
	conn      *timedConn
	br        *bufio.Reader
	closeConn bool
	stream    responseBody
}

// bodyKind is what an exchange has of the response body.
type bodyKind int

const (
	bodyNone bodyKind = iota
	bodySmall
	bodyStream
)

var exchangePool = sync.Pool{New: func() any { return new(exchange) }}

// release returns the exchange to its pool, its response already reset.
func (ex *exchange) release() { exchangePool.Put(ex) }

// maxCheckBody bounds a health check's response, the only one read whole
// by fasthttp.
const maxCheckBody = 64 << 20

// Hop is what the edge adds to the request as one more proxy on its way.
// Serve keeps no string of it past its return (a streamed body keeps a
// copy of RequestID), so the caller may lend views of its own buffers;
// Tunnels.Serve keeps hop for the tunnel's life.
type Hop struct {
	// Peer is the socket peer's address: appended to X-Forwarded-For and
	// written as Forwarded's for= (empty: neither gets a hop).
	Peer string
	// Trusted says the peer is a trusted proxy: its own forwarding fields
	// (X-Forwarded-Proto and -Host, earlier Forwarded and X-Forwarded-For
	// hops) are kept. The caller removes an untrusted peer's before Serve,
	// and Serve writes -Proto and -Host from the connection instead.
	Trusted bool
	// RequestID, when not empty, replaces X-Request-ID.
	RequestID string
	// AtEnd, when set, is called once when a streamed response's body has
	// ended (written whole, cut, or dropped unwritten), after its origin
	// connection is given back: what the caller holds for the whole
	// exchange (a concurrency slot) it gives back there. It is not called
	// when Serve returns the whole response: ctx.Response.IsBodyStream()
	// after Serve tells which.
	AtEnd func()
	// Path, when not empty, is sent instead of the client's path: a
	// decoded path (the one the rules matched), which Serve escapes
	// again (pathsem.AppendEscaped). The query string stays as sent.
	Path string
}

// Serve forwards ctx.Request to an origin and writes the origin's response
// (or a 502/504 problem) into ctx.Response, replacing whatever was there:
// the caller adds its own response headers after Serve returns. The
// request line reaches the origin as the client sent it: the path and the
// query string byte for byte. Serve returns once the origin's header is
// in; a body larger than 64 KiB or of unknown length is then a body stream
// of ctx.Response, which the server copies to the client and closes.
func (p *Proxy) Serve(ctx *fasthttp.RequestCtx, hop Hop) {
	start := time.Now()
	deadline, until, overall := start.Add(p.cfg.HeaderTimeout), time.Time{}, false
	if p.cfg.Timeout > 0 {
		until = start.Add(p.cfg.Timeout)
		if until.Before(deadline) {
			deadline, overall = until, true
		}
	}

	var o *origin // the last origin tried
	ex := exchangePool.Get().(*exchange)
	kept := false // the exchange went with a streamed body
	defer func() {
		ex.req.Reset()
		if !kept {
			ex.finish(o, false)
			ex.release()
		}
	}()
	req := &ex.req
	streamed := ctx.Request.IsBodyStream()
	defer func() {
		if streamed && !ex.body.eof {
			// The client's body was not read to its end: its rest must not
			// be taken for the next request on the connection.
			ctx.SetConnectionClose()
		}
		ex.body = bodyReader{}
	}()
	if !p.prepare(ctx, ex, hop) {
		p.metrics.errors[reasonClientBody].Inc()
		return
	}

	var (
		err error
		why reason
	)
	for attempt := 0; attempt < 2; attempt++ {
		next := p.pick(o)
		if next == nil {
			break // no other origin to retry on
		}
		o = next
		req.URI().SetScheme(o.scheme)
		if p.cfg.RewriteHost || len(ctx.Request.Header.Host()) == 0 {
			req.Header.SetHost(o.host)
		}
		err = p.roundTrip(o, ex, deadline, until, !ctx.Request.Header.IsHTTP11())
		why = classify(err)
		p.countTimeout(why, err, overall)
		if err != nil && ex.body.err != nil {
			// The client's body failed the exchange, not the origin.
			why = reasonClientBody
			if errors.Is(ex.body.err, errRequestTooLarge) {
				why = reasonRequestTooLarge
			}
		}
		p.record(o, why, err, hop.RequestID)
		if !errors.Is(err, errDial) || len(p.origins) == 1 {
			break
		}
	}

	if why == reasonNone {
		kept = p.answer(ctx, ex, o, hop.RequestID, hop.AtEnd)
		p.metrics.response(ctx.Response.StatusCode())
		p.metrics.durOK.Observe(time.Since(start).Seconds())
		return
	}
	// Whatever the failed exchange left half-read must not reach the client.
	ctx.Response.Reset()
	outcome := p.metrics.durError
	switch why {
	case reasonTimeout:
		writeProblem(ctx, problemTimeout)
		outcome = p.metrics.durTimeout
	case reasonConnect:
		writeProblem(ctx, problemConnect)
	case reasonTLS:
		writeProblem(ctx, problemTLS)
	case reasonBodyTooLarge:
		writeProblem(ctx, problemTooLarge)
	case reasonNoFreeConns:
		writeProblem(ctx, problemNoFreeConns)
	case reasonRequestTooLarge:
		writeProblem(ctx, problemRequestTooLarge)
	case reasonClientBody:
		writeProblem(ctx, problemClientBody)
	default:
		writeProblem(ctx, problemOther)
	}
	outcome.Observe(time.Since(start).Seconds())
}

// answer writes the origin's response (its header in ex.resp) into
// ctx.Response: the header without its hop-by-hop fields, and the small
// body read with it, or the body as a stream. It reports whether the
// stream took the exchange.
func (p *Proxy) answer(ctx *fasthttp.RequestCtx, ex *exchange, o *origin, requestID string, atEnd func()) bool {
	resp := &ex.resp
	n := resp.Header.ContentLength()
	resp.Header.CopyTo(&ctx.Response.Header)
	ctx.Response.ResetBody()
	stripHopByHop(&ctx.Response.Header, ex)
	switch ex.kind {
	case bodyNone:
		return false
	case bodySmall:
		// The body changes hands rather than being copied: the response
		// takes the exchange's buffer and the exchange keeps the
		// response's empty one, for the next body it reads. Both are
		// pooled; a 64 KiB body costs one copy less.
		ex.small = ctx.Response.SwapBody(ex.small)[:0]
		return false
	}
	// The stream outlives Serve, and the id may be a view of the caller's
	// buffer (Hop): it keeps a copy.
	ex.stream = responseBody{p: p, ex: ex, src: resp.BodyStream(), conn: ex.conn, o: o, id: strings.Clone(requestID), atEnd: atEnd}
	p.register(ex.conn)
	ctx.Response.SetBodyStream(&ex.stream, max(n, -1))
	// The server holds the header in its write buffer until the first
	// piece of the body is written. When none of the body came in with the
	// origin's header, that piece may be long in coming (a server-sent
	// event stream, a long poll, a slow object store): the header goes out
	// at once then. When some did (most responses), it goes out with it,
	// in one write.
	ctx.Response.ImmediateHeaderFlush = ex.br.Buffered() == 0
	return true
}

// register adds a streaming connection to those EndStreams ends.
func (p *Proxy) register(c *timedConn) {
	if c == nil {
		return
	}
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	if p.ended {
		c.end()
	}
	p.streams[c] = struct{}{}
}

func (p *Proxy) unregister(c *timedConn) {
	if c == nil {
		return
	}
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	delete(p.streams, c)
}

// EndStreams ends every response body streaming from an origin, and any
// that starts later: each is cut short (its client sees the body end
// early) and its connection closed. A shutdown calls it when its drain is
// nearly over, so streams that would never end (server-sent events) do not
// outlast it.
func (p *Proxy) EndStreams() {
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	p.ended = true
	for c := range p.streams {
		c.end()
	}
}

// Streaming is how many response bodies are streaming from the pool's
// origins: a retired pool is let go once it has none.
func (p *Proxy) Streaming() int {
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	return len(p.streams)
}

// MaxRequestBodySize is the pool's cap on a request body (0: none): what
// a declared Content-Length is checked against before Serve.
func (p *Proxy) MaxRequestBodySize() int { return p.cfg.MaxRequestBodySize }

// Limited says whether the pool has a concurrency limit: without one,
// AcquireLimit admits at once and its release does nothing, so a caller
// may skip both (and the clock read for the release).
func (p *Proxy) Limited() bool { return p.limit != nil }

// AcquireLimit takes a place in the pool's concurrency limit for a request
// of tier at now, waiting in the pool's queue while gone says the client
// is still there; with no limit it admits at once. A refusal is counted by
// reason. An admitted request calls release once its origin exchange has
// ended (see shedder.PoolLimit.Acquire).
func (p *Proxy) AcquireLimit(now time.Time, tier shedder.Tier, gone func() bool) (release func(now time.Time, rtt time.Duration, sample bool), err error) {
	if p.limit == nil {
		return noLimit, nil
	}
	release, err = p.limit.Acquire(context.Background(), now, tier, gone)
	switch {
	case err == nil:
	case errors.Is(err, shedder.ErrQueueTimeout):
		p.metrics.refused[limitQueueTimeout].Inc()
	case errors.Is(err, shedder.ErrGone):
		p.metrics.refused[limitGone].Inc()
	default:
		p.metrics.refused[limitQueueFull].Inc()
	}
	return release, err
}

func noLimit(time.Time, time.Duration, bool) {}

// countTimeout counts a failed attempt's timeout by phase: connect (the
// dial or the TLS handshake), header (HeaderTimeout) or total (Timeout,
// when it came first).
func (p *Proxy) countTimeout(why reason, err error, overall bool) {
	switch {
	case (why == reasonConnect || why == reasonTLS) && (errors.Is(err, fasthttp.ErrDialTimeout) || isTimeout(err)):
		p.metrics.timeouts[phaseConnect].Inc()
	case why == reasonTimeout && overall:
		p.metrics.timeouts[phaseTotal].Inc()
	case why == reasonTimeout:
		p.metrics.timeouts[phaseHeader].Inc()
	}
}

// prefetchedBody is how much of a streamed body fasthttp's server has
// read before the handler runs: a declared body this small is in memory.
const prefetchedBody = 8 << 10

// prepare fills ex.req with the upstream copy of the client request. It
// reports false when the client's body could not be read (the problem is
// written).
func (p *Proxy) prepare(ctx *fasthttp.RequestCtx, ex *exchange, hop Hop) bool {
	req := &ex.req
	ctx.Request.CopyTo(req)
	// The query string as received: a URI whose arguments were parsed (the
	// rules read query parameters) would otherwise be written back from
	// them, re-encoded (%7e → ~, "a b" → a+b, empty pairs dropped), which
	// breaks signed URLs. The path goes as received too (the origin
	// clients' DisablePathNormalizing).
	req.URI().SetQueryStringBytes(ctx.URI().QueryString())
	if hop.Path != "" {
		ex.buf = pathsem.AppendEscaped(ex.buf[:0], hop.Path)
		req.URI().SetPathBytes(ex.buf)
	}
	if ctx.Request.IsBodyStream() {
		// CopyTo leaves streams behind. Hide the server's stream behind a
		// plain Reader: releasing our request must not close or recycle a
		// stream the server still owns.
		ex.body = bodyReader{r: ctx.RequestBodyStream(), left: p.cfg.MaxRequestBodySize, limited: p.cfg.MaxRequestBodySize > 0}
		if n := ctx.Request.Header.ContentLength(); n >= 0 && n <= prefetchedBody {
			// Already in memory: send it as a plain body, which the
			// client resends when a pooled connection turns out closed
			// (a stream, once read, cannot be).
			req.ResetBody() // CopyTo may have copied the prefetched part
			if _, err := io.CopyN(req.BodyWriter(), &ex.body, int64(n)); err != nil {
				writeProblem(ctx, problemClientBody)
				return false
			}
			ex.body.eof = true
		} else {
			req.SetBodyStream(&ex.body, n)
		}
	}
	// The Host header says where the request goes; the URI's host must not
	// override it when the request line was in absolute form.
	req.UseHostHeader = true

	forward(&req.Header, ex, hop, ctx.IsTLS(), ctx.Request.Header.Host())
	return true
}

// forward rewrites h, a copy of the client's request header, for the
// origin: the hop-by-hop fields and Expect out, and the forwarding fields
// (X-Forwarded-For, -Proto and -Host, Forwarded, X-Request-ID) set for
// this hop. host is what the origin gets as Host.
//
// One look over the names (requestFields) says which of those fields the
// request carries: most carry none, and a field asked for by name costs a
// copy and a normalization of the name and a scan of every field, whether
// it is there or not. The fields set here go in under their canonical
// names, as Set would write them.
func forward(h *fasthttp.RequestHeader, ex *exchange, hop Hop, tls bool, host []byte) {
	fields := requestFields(h)
	// Strip first: a header the client named in Connection must not take
	// out one of ours. A field it takes out stays in fields: asking for it
	// again finds nothing, as before.
	if fields&fieldHopByHop != 0 {
		stripAll(h, ex)
	}
	// The edge's server has already answered Expect: 100-continue and holds
	// the body; passing it on would only make the origin send a 100 too.
	if fields&fieldExpect != 0 {
		h.Del(fasthttp.HeaderExpect)
	}

	ex.buf = ex.buf[:0]
	if fields&fieldXFF != 0 {
		ex.buf = joinLines(ex.buf, h.PeekAll(fasthttp.HeaderXForwardedFor))
		// Del then set: Set only replaces the first of several lines.
		h.Del(fasthttp.HeaderXForwardedFor)
	}
	if hop.Peer != "" {
		if len(ex.buf) > 0 {
			ex.buf = append(ex.buf, ", "...)
		}
		ex.buf = append(ex.buf, hop.Peer...)
	}
	if len(ex.buf) > 0 {
		h.SetCanonical(keyXForwardedFor, ex.buf)
	}

	proto, protoField := "http", protoHTTP
	if tls {
		proto, protoField = "https", protoHTTPS
	}
	if !hop.Trusted || fields&fieldXFProto == 0 || len(h.Peek(fasthttp.HeaderXForwardedProto)) == 0 {
		h.SetCanonical(keyXForwardedProto, protoField)
	}
	if !hop.Trusted || fields&fieldXFHost == 0 || len(h.Peek(fasthttp.HeaderXForwardedHost)) == 0 {
		if len(host) > 0 {
			h.SetCanonical(keyXForwardedHost, host)
		} else if fields&fieldXFHost != 0 {
			h.Del(fasthttp.HeaderXForwardedHost)
		}
	}
	// RFC 7239: the earlier hops a trusted peer wrote, then ours.
	ex.buf = ex.buf[:0]
	if fields&fieldForwarded != 0 {
		ex.buf = joinLines(ex.buf, h.PeekAll(headerForwarded))
		h.Del(headerForwarded)
	}
	if hop.Peer != "" {
		if len(ex.buf) > 0 {
			ex.buf = append(ex.buf, ", "...)
		}
		ex.buf = appendForwarded(ex.buf, hop.Peer, proto, host)
	}
	if len(ex.buf) > 0 {
		h.SetCanonical(keyForwarded, ex.buf)
	}
	if hop.RequestID != "" {
		ex.buf = append(ex.buf[:0], hop.RequestID...)
		h.SetCanonical(keyRequestID, ex.buf)
	}
}

// fieldSet is which of the fields forward rewrites a request carries.
type fieldSet uint8

const (
	fieldHopByHop fieldSet = 1 << iota
	fieldExpect
	fieldXFF
	fieldXFProto
	fieldXFHost
	fieldForwarded
)

// requestFields looks over h's names once, in any case, without copying or
// normalizing any (what anyHopByHop does for the hop-by-hop names alone).
func requestFields(h *fasthttp.RequestHeader) fieldSet {
	var s fieldSet
	for k := range h.All() {
		s |= fieldOf(k)
	}
	return s
}

// fieldOf is the field forward rewrites that k names, in any case (0: none).
// The first byte sorts the names (forward's start with e, f or x, the
// hop-by-hop ones with none of them), the length picks the one name to
// compare: a field that is neither, nearly every one, costs a switch or
// two (TestFieldOfAgreesWithTheNames holds it to a comparison with each).
func fieldOf(k []byte) fieldSet {
	if len(k) == 0 {
		return 0
	}
	switch k[0] | 0x20 {
	case 'e':
		if reqhead.FoldEqual(k, "expect") {
			return fieldExpect
		}
	case 'f':
		if reqhead.FoldEqual(k, "forwarded") {
			return fieldForwarded
		}
	case 'x':
		switch len(k) {
		case len(fasthttp.HeaderXForwardedFor):
			if reqhead.FoldEqual(k, "x-forwarded-for") {
				return fieldXFF
			}
		case len(fasthttp.HeaderXForwardedHost):
			if reqhead.FoldEqual(k, "x-forwarded-host") {
				return fieldXFHost
			}
		case len(fasthttp.HeaderXForwardedProto):
			if reqhead.FoldEqual(k, "x-forwarded-proto") {
				return fieldXFProto
			}
		}
	default:
		if isHopByHop(k) {
			return fieldHopByHop
		}
	}
	return 0
}

// The names forward sets, as fasthttp's Set normalizes them
// (TestForwardMatchesFieldByField holds them to it): SetCanonical takes
// them as they are.
var (
	keyXForwardedFor   = []byte(fasthttp.HeaderXForwardedFor)
	keyXForwardedProto = []byte(fasthttp.HeaderXForwardedProto)
	keyXForwardedHost  = []byte(fasthttp.HeaderXForwardedHost)
	keyForwarded       = []byte(headerForwarded)
	keyRequestID       = []byte("X-Request-Id") // headerRequestID, normalized
	protoHTTP          = []byte("http")
	protoHTTPS         = []byte("https")
)

const (
	headerRequestID = "X-Request-ID"
	headerForwarded = "Forwarded"
)

// joinLines appends a field's lines to dst as one comma-separated list.
func joinLines(dst []byte, lines [][]byte) []byte {
	for _, v := range lines {
		if len(dst) > 0 {
			dst = append(dst, ", "...)
		}
		dst = append(dst, v...)
	}
	return dst
}

// appendForwarded appends one RFC 7239 element: for= the peer (an IPv6
// address bracketed and quoted), proto=, and host= when there is one
// (quoted when it is not a token, as host:port is not).
func appendForwarded(dst []byte, peer, proto string, host []byte) []byte {
	dst = append(dst, "for="...)
	if strings.IndexByte(peer, ':') >= 0 {
		dst = append(dst, `"[`...)
		dst = append(dst, peer...)
		dst = append(dst, `]"`...)
	} else {
		dst = append(dst, peer...)
	}
	dst = append(dst, ";proto="...)
	dst = append(dst, proto...)
	if len(host) > 0 {
		dst = append(dst, ";host="...)
		if isToken(host) {
			dst = append(dst, host...)
		} else {
			dst = strconv.AppendQuote(dst, string(host))
		}
	}
	return dst
}

// isToken reports whether b is an RFC 9110 token (Forwarded's unquoted
// value form).
func isToken(b []byte) bool {
	for _, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return len(b) > 0
}

// errRequestTooLarge stops a streamed client body at MaxRequestBodySize.
var errRequestTooLarge = errors.New("request body exceeds the size limit")

// bodyReader is the client's body stream as the origin client reads it:
// a plain Reader (releasing our request must not close or recycle a stream
// the server still owns) that enforces the size limit and remembers
// whether the body ended and how it failed.
type bodyReader struct {
	r       io.Reader
	left    int
	limited bool
	eof     bool
	err     error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		// Sticky: fasthttp's chunked writer sends the bytes of a read that
		// also failed and reads again.
		return 0, b.err
	}
	if b.limited && len(p) > b.left+1 {
		p = p[:b.left+1] // one byte past the limit tells "too large" from "exactly"
	}
	n, err := b.r.Read(p)
	if b.limited {
		if n > b.left {
			b.err = errRequestTooLarge
			return b.left, b.err
		}
		b.left -= n
	}
	switch {
	case errors.Is(err, io.EOF):
		b.eof = true
	case err != nil:
		b.err = err
	}
	return n, err
}

// pick returns an ejected origin whose ejection is over (on probation:
// this request tries it), else the least-loaded healthy origin other than
// skip, else the origin other than skip that failed longest ago, else nil.
func (p *Proxy) pick(skip *origin) *origin {
	n := len(p.origins)
	if n == 1 {
		if p.origins[0] == skip {
			return nil
		}
		return p.origins[0]
	}
	start := int(p.next.Add(1) % uint32(n))
	var best *origin
	var bestLoad int32
	var now int64 // read once, and only when an origin is out
	for i := range n {
		o := p.origins[(start+i)%n]
		if o == skip {
			continue
		}
		if !o.healthy.Load() {
			if now == 0 {
				now = p.now().UnixNano()
			}
			if p.probe(o, now) {
				return o
			}
			continue
		}
		if load := o.pending.Load(); best == nil || load < bestLoad {
			best, bestLoad = o, load
		}
	}
	if best != nil {
		return best
	}
	var oldest int64
	for _, o := range p.origins {
		if o == skip {
			continue
		}
		if t := o.lastFail.Load(); best == nil || t < oldest {
			best, oldest = o, t
		}
	}
	return best
}

// classify maps a client error to the reason we report and act on.
func classify(err error) reason {
	if err == nil {
		return reasonNone
	}
	var ne net.Error
	switch {
	case errors.Is(err, errTLS):
		// An unverifiable certificate is as unreachable as a refused
		// connection, and nothing was sent either.
		return reasonTLS
	case errors.Is(err, errDial):
		// Includes dial timeouts: the origin is unreachable, not slow.
		return reasonConnect
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return reasonBodyTooLarge
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return reasonTimeout
	case errors.Is(err, fasthttp.ErrConnectionClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EPIPE):
		return reasonConnect
	case errors.As(err, &ne) && ne.Timeout():
		return reasonTimeout
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		// Our own pool is full, which says nothing about the origin's
		// health.
		return reasonNoFreeConns
	default:
		return reasonOther
	}
}

// record feeds one attempt's outcome into health, metrics and the log.
func (p *Proxy) record(o *origin, why reason, err error, requestID string) {
	switch why {
	case reasonNone:
		p.succeeded(o, "request")
		return
	case reasonConnect, reasonTLS, reasonTimeout:
		p.failed(o, "request")
	}
	p.metrics.errors[why].Inc()
	if !o.mayLog() {
		return
	}
	p.log.Warn("origin request failed",
		"origin", o.url, "reason", why.String(), "err", err,
		"request_id", strings.Clone(requestID), "suppressed", o.suppressed.Swap(0))
}

// logStream logs a streamed body that did not end well. It says nothing
// about the origin's health: a client going away or a quiet event stream
// ends a stream as surely as a failing origin.
func (p *Proxy) logStream(o *origin, end streamEnd, err error, requestID string) {
	if !o.mayLog() {
		return
	}
	p.log.Info("origin response stream cut short",
		"origin", o.url, "end", end.String(), "err", err,
		"request_id", strings.Clone(requestID), "suppressed", o.suppressed.Swap(0))
}

// mayLog keeps an outage from turning into one log line per request: at
// most one line per origin per second, the others counted as suppressed.
func (o *origin) mayLog() bool {
	now := time.Now().Unix()
	if last := o.logSecond.Load(); last == now || !o.logSecond.CompareAndSwap(last, now) {
		o.suppressed.Add(1)
		return false
	}
	return true
}

// succeeded resets the failure streak and brings the origin back into
// rotation if it was out.
func (p *Proxy) succeeded(o *origin, via string) {
	if o.fails.Load() != 0 {
		o.fails.Store(0)
	}
	if !o.healthy.Load() && o.healthy.CompareAndSwap(false, true) {
		o.ejectedUntil.Store(0)
		o.ejections.Store(0)
		o.probing.Store(false)
		p.log.Info("origin back in rotation", "pool", p.cfg.Pool, "origin", o.url, "via", via)
	}
}

// failed extends the failure streak and takes the origin out of rotation
// once it reaches UnhealthyAfter. A failed request ejects it: the one
// that completes the streak, a probe on probation (again, for longer each
// time), or one tried on an origin the checks took out.
func (p *Proxy) failed(o *origin, via string) {
	now := p.now()
	o.lastFail.Store(now.UnixNano())
	n := o.fails.Add(1)
	if int(n) < p.cfg.UnhealthyAfter {
		return
	}
	out := o.healthy.CompareAndSwap(true, false)
	if via != "request" {
		if out {
			p.log.Warn("origin out of rotation", "pool", p.cfg.Pool, "origin", o.url, "via", via, "consecutive_failures", n)
		}
		return
	}
	switch {
	case out: // the streak took it out
	case o.probing.CompareAndSwap(true, false): // its probe failed
	case o.ejectedUntil.Load() == 0: // out by the checks; a request failed too
	default:
		// A request that was under way when the origin left rotation, or
		// the last resort: the ejection running already accounts for it.
		return
	}
	k := o.ejections.Add(1)
	d := ejectionTime(p.cfg.EjectFor, k)
	o.ejectedUntil.Store(now.Add(d).UnixNano())
	p.metrics.ejections.Inc()
	p.log.Warn("origin out of rotation", "pool", p.cfg.Pool, "origin", o.url, "via", via,
		"consecutive_failures", n, "ejections", k, "eject_for", d)
}

// maxEjectFactor caps an ejection at this many EjectFor.
const maxEjectFactor = 8

// ejectionTime is how long the k-th ejection in a row lasts: EjectFor,
// doubling with each ejection since the origin was last in rotation, up to
// maxEjectFactor × EjectFor (30s, 1m, 2m, then 4m with the default), so a
// dead origin costs one request every few minutes rather than every 30s.
func ejectionTime(base time.Duration, k int32) time.Duration {
	f := time.Duration(1)
	for i := int32(1); i < k && f < maxEjectFactor; i++ {
		f *= 2
	}
	return base * f
}

// probe reports whether the ejected o is on probation at now (unix
// nanoseconds) and this request takes the probe: one request per EjectFor
// does, the others keep out of it until the probe's answer (a success
// brings the origin back; a failure ejects it again).
func (p *Proxy) probe(o *origin, now int64) bool {
	until := o.ejectedUntil.Load()
	if until == 0 || now < until {
		return false
	}
	if !o.ejectedUntil.CompareAndSwap(until, now+int64(p.cfg.EjectFor)) {
		return false
	}
	o.probing.Store(true)
	return true
}

// Healthy returns how many origins are in rotation.
func (p *Proxy) Healthy() int {
	n := 0
	for _, o := range p.origins {
		if o.healthy.Load() {
			n++
		}
	}
	return n
}

// Origins reports every origin, in configuration order.
func (p *Proxy) Origins() []OriginStatus {
	out := make([]OriginStatus, len(p.origins))
	for i, o := range p.origins {
		out[i] = OriginStatus{URL: o.url, Healthy: o.healthy.Load()}
	}
	return out
}

// Close stops the health checks at once, removes the pool's series (its
// healthy gauge with them) and drops idle origin connections. Serve keeps
// working afterwards (passive health only), so a draining edge can finish
// its in-flight requests; a body still streaming is not cut (EndStreams
// does that), and every connection coming back after Close is closed
// rather than kept idle.
func (p *Proxy) Close() {
	p.stopOnce.Do(func() { close(p.stop) })
	p.checkDone.Wait()
	p.shared.close(p, p.label)
	for _, o := range p.origins {
		o.closed.Store(true)
		o.client.CloseIdleConnections()
	}
}

// hopByHop lists the headers that describe one connection, not the
// message (RFC 9110 §7.6.1), plus Proxy-Connection, which old clients
// still send.
var hopByHop = [...]string{
	fasthttp.HeaderConnection,
	"Proxy-Connection",
	fasthttp.HeaderKeepAlive,
	fasthttp.HeaderProxyAuthenticate,
	fasthttp.HeaderProxyAuthorization,
	fasthttp.HeaderTE,
	fasthttp.HeaderTrailer,
	fasthttp.HeaderTransferEncoding,
	fasthttp.HeaderUpgrade,
}

// anyHopByHop reports whether h holds a hop-by-hop name, in any case. The
// concrete types let the compiler keep All's closures off the heap. A
// request header's All gathers its cookies, as the trust screen's walk
// over the same header has already done on the edge.
func anyHopByHop(h headers) bool {
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		for k := range h.All() {
			if isHopByHop(k) {
				return true
			}
		}
		return false
	case *fasthttp.ResponseHeader:
		for k := range h.All() {
			if isHopByHop(k) {
				return true
			}
		}
		return false
	}
	return true // another kind of header: delete one by one
}

// isHopByHop reports whether k is one of hopByHop's names, in any case:
// its length and first byte pick the one name to compare.
func isHopByHop(k []byte) bool {
	var lower string
	switch len(k) {
	case 2:
		lower = "te"
	case 7:
		switch k[0] | 0x20 {
		case 't':
			lower = "trailer"
		case 'u':
			lower = "upgrade"
		default:
			return false
		}
	case 10:
		switch k[0] | 0x20 {
		case 'c':
			lower = "connection"
		case 'k':
			lower = "keep-alive"
		default:
			return false
		}
	case 16:
		lower = "proxy-connection"
	case 17:
		lower = "transfer-encoding"
	case 18:
		lower = "proxy-authenticate"
	case 19:
		lower = "proxy-authorization"
	default:
		return false
	}
	return reqhead.FoldEqual(k, lower)
}

// headers is what stripHopByHop needs from a request or response header.
type headers interface {
	PeekAll(key string) [][]byte
	Del(key string)
	DelBytes(key []byte)
}

// stripHopByHop removes the fixed hop-by-hop headers and every header the
// Connection header names. The names are copied out first because deleting
// headers moves the storage PeekAll's slices point into.
//
// Most messages carry none of them: one look over the names, without
// copying or normalizing any, spares the nine deletions, each of which
// normalizes its name and scans every field. Deleting a name that is not
// there changes nothing (a Connection: close or a Trailer that fasthttp
// keeps apart is listed by All too).
func stripHopByHop(h headers, ex *exchange) {
	if anyHopByHop(h) {
		stripAll(h, ex)
	}
}

// stripAll is stripHopByHop without the look first.
func stripAll(h headers, ex *exchange) {
	ex.buf = ex.buf[:0]
	for _, v := range h.PeekAll(fasthttp.HeaderConnection) {
		ex.buf = append(ex.buf, v...)
		ex.buf = append(ex.buf, ',')
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	for rest := ex.buf; len(rest) > 0; {
		tok := rest
		if i := bytes.IndexByte(rest, ','); i >= 0 {
			tok, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if tok = bytes.TrimSpace(tok); len(tok) > 0 {
			h.DelBytes(tok)
		}
	}
}
