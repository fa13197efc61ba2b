package listen

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// HTTP/2 on --listen-tls (ALPN h2), served by net/http's HTTP/2 server. Each
// stream runs the edge's one request path (handle) on a fasthttp request
// built from the stream's, so the screen, the trust model, shedding,
// limits, the access log and the metrics are HTTP/1.1's: the :authority is
// the request's Host, forwarding fields from an untrusted peer are dropped,
// and the origin gets the request as HTTP/1.1 with X-Forwarded-Proto https.
//
// What one connection may cost is bounded:
//   - streams at once: --h2-max-concurrent-streams (SETTINGS), and each
//     stream's handler takes one of the edge's workers like any request;
//   - the header list: --max-header-bytes (SETTINGS_MAX_HEADER_LIST_SIZE;
//     a larger one is answered 431);
//   - rapid reset (CVE-2023-44487): net/http starts at most
//     max-concurrent-streams handlers and ends a connection whose queue of
//     unstarted ones passes four times that (ENHANCE_YOUR_CALM); on top of
//     it, the edge closes a connection that resets more than
//     h2ResetBurst streams in a burst or h2ResetRate a second over time,
//     the resets the server sends for the client's errors included;
//   - PING, SETTINGS and PRIORITY floods: more than h2ControlBurst in a
//     burst or h2ControlRate a second over time close the connection (net/http
//     itself caps the acknowledgements it queues for a client that does
//     not read them);
//   - every other frame type (h2_frames.go): WINDOW_UPDATE beyond what the
//     DATA sent needs, and frames that do no work, past budgets of their own.

// Per-connection budgets of frames a client sends (token buckets). A
// browser that leaves a page resets its streams at once; it never resets
// hundreds a second for long, nor pings more than a few times.
const (
	h2ResetBurst   = 200
	h2ResetRate    = 100 // per second
	h2ControlBurst = 100
	h2ControlRate  = 10 // per second
)

// errH2Flood ends a connection that spent a frame budget.
var errH2Flood = errors.New("http2: frame flood")

// H2Metrics are the edge's HTTP/2 series.
type H2Metrics struct {
	floods *prometheus.CounterVec // frame
}

// Collectors are the series to register.
func (m *H2Metrics) Collectors() []prometheus.Collector { return []prometheus.Collector{m.floods} }

// newH2Metrics makes the HTTP/2 series.
func newH2Metrics() *H2Metrics {
	m := &H2Metrics{floods: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_tls_h2_floods_total",
		Help: "HTTP/2 connections closed for a flood, by the budget spent: rst_stream (the client's resets beyond the edge's budget), provoked_resets (resets the server sent for the client's protocol errors, on the same budget), early_resets (net/http's queue of unstarted handlers full), control (PING, SETTINGS, PRIORITY, PRIORITY_UPDATE or GOAWAY frames), window_update (WINDOW_UPDATE beyond what the DATA sent needs), empty_data (DATA without data or END_STREAM), ping_ack (PING ACK no PING asked for), continuation (empty CONTINUATION), unknown (frame types HTTP/2 does not define).",
	}, []string{"frame"})}
	for _, f := range h2FloodFrames {
		m.floods.WithLabelValues(f)
	}
	return m
}

// H2Server serves the h2 connections of the TLS listener: fasthttp hands
// each (decrypted, metered) to net/http's HTTP/2 server through a listener
// of its own, and waits until it is done with it.
type H2Server struct {
	cfg h2Config
	hs  *http.Server // its Shutdown sends every connection a GOAWAY
	ln  *connQueue
	m   *H2Metrics

	streams *H2StreamMetrics // h2_streams.go
	held    *h2Budget

	// stopping is set by Shutdown; lingering counts the connections whose
	// close it put off (h2MeteredConn.Close).
	stopping  atomic.Bool
	lingering sync.WaitGroup
}

// h2Config is what the HTTP/2 server is built from: the pipeline it runs
// every stream through, the per-client cap its streams count against, and
// the edge's limits and timeouts.
type h2Config struct {
	Addr           net.Addr                // the TLS listener's
	Handler        fasthttp.RequestHandler // the request pipeline
	Counts         *ConnCounts             // the public listeners' per-client cap
	Log            *slog.Logger
	Metrics        *H2Metrics
	StreamMetrics  *H2StreamMetrics
	MaxStreams     int   // --h2-max-concurrent-streams
	MaxHeldBytes   int64 // --h2-max-held-bytes
	MaxHeaderBytes int
	ReadTimeout    time.Duration
	WriteTimeout   time.Duration
	IdleTimeout    time.Duration
}

// newH2Server is the HTTP/2 server of the TLS listener's h2 connections:
// Serve runs it, ServeConn is fasthttp's NextProto handler.
func newH2Server(cfg h2Config) *H2Server {
	h := &H2Server{cfg: cfg, m: cfg.Metrics, ln: newConnQueue(cfg.Addr)}
	h.streams, h.held = cfg.StreamMetrics, newH2Budget(cfg.MaxHeldBytes, cfg.StreamMetrics.held)
	// TLS is the edge's: net/http sees the decrypted stream, which starts
	// with the HTTP/2 preface.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h.hs = &http.Server{
		Handler:        http.HandlerFunc(h.serveStream),
		Protocols:      &protos,
		MaxHeaderBytes: cfg.MaxHeaderBytes,
		// A stream's request body must arrive within this (fasthttp's
		// ReadTimeout for HTTP/1.1).
		ReadTimeout: cfg.ReadTimeout,
		IdleTimeout: cfg.IdleTimeout,
		ErrorLog:    slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cfg.MaxStreams,
			// A write that makes no progress for this long ends the
			// connection (a client that stopped reading).
			WriteByteTimeout: cfg.WriteTimeout,
			CountError: func(errType string) {
				// net/http names an error by its kind and code, then
				// its cause: "conn_ENHANCE_YOUR_CALM_too_many_early_resets".
				if strings.HasSuffix(errType, "too_many_early_resets") {
					h.m.floods.WithLabelValues("early_resets").Inc()
				}
			},
		},
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, h2ConnKey{}, c)
		},
		ConnState: h.connState,
	}
	return h
}

// connState catches a connection that missed the shutdown's GOAWAY.
// net/http's HTTP/2 server registers a connection for the GOAWAY only once
// it has read the client's preface, and then reports it active: one
// accepted before the shutdown whose preface came after the shutdown's
// pass over the registered connections would be served on, untold, until
// the shutdown's deadline cut it (and its streams). Its first report
// while the server is stopping runs that pass again; a connection already
// told is not told twice.
func (h *H2Server) connState(c net.Conn, st http.ConnState) {
	if st != http.StateActive {
		return
	}
	mc, ok := c.(*h2MeteredConn)
	if !ok || mc.registered.Load() { // every later report: a load
		return
	}
	if mc.registered.CompareAndSwap(false, true) && h.stopping.Load() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), h2ShutdownLinger)
			defer cancel()
			_ = h.hs.Shutdown(ctx) // a pass of its own; H2Server.Shutdown's call waits for the connections
		}()
	}
}

// h2ConnKey carries a connection's *h2MeteredConn in its streams' contexts.
type h2ConnKey struct{}

// Serve runs net/http's server until shutdown.
func (h *H2Server) Serve() error {
	if err := h.hs.Serve(h.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ServeConn serves one h2 connection (fasthttp's NextProto handler) until
// net/http closes it.
func (h *H2Server) ServeConn(c net.Conn) error {
	tc, ok := c.(*serverTLSConn)
	if !ok {
		return errors.New("http2: not a TLS connection")
	}
	mc := &h2MeteredConn{Conn: tc, state: tc.ConnectionState(), closed: make(chan struct{}), srv: h}
	maxStreams := h.cfg.MaxStreams
	if maxStreams <= 0 {
		maxStreams = math.MaxInt // net/http's own default: no reset is owed early
	}
	mc.init(h.m, h.hs.MaxHeaderBytes, maxStreams)
	mc.streams = h.openConnStreams(tc)
	defer mc.streams.close()
	select {
	case h.ln.conns <- mc:
	case <-h.ln.done:
		return refuseUnserved(tc)
	}
	<-mc.closed
	return nil
}

// refuseUnserved ends an h2 connection that came after the server began
// shutting down (its TLS handshake finished late), which net/http will not
// serve: its client may already have sent a request on it. The server's
// preface (an empty SETTINGS) and a GOAWAY of last stream 0, NO_ERROR,
// tell the client that no stream was processed, so it sends its requests
// again on another connection (RFC 9113 §6.8); a bare close would fail
// them. What the client sent is read and dropped until it closes, or for
// h2ShutdownLinger at most: a close with it unread would reset the
// connection, and the GOAWAY could be lost with the reset.
func refuseUnserved(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(h2ShutdownLinger))
	var f [9 + 9 + 8]byte
	f[3] = h2FrameSettings
	f[9+2], f[9+3] = 8, h2FrameGoAway // last stream 0 and h2ErrNo: the payload's zeros
	if _, err := c.Write(f[:]); err == nil {
		_, _ = io.Copy(io.Discard, c)
	}
	return c.Close()
}

// http11 is the protocol a stream is given to the pipeline as.
var http11 = []byte("HTTP/1.1")

// http2Preface starts every HTTP/2 client connection (RFC 9113 §3.4).
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Shutdown asks every h2 connection to finish its streams and close
// (GOAWAY), and waits for them until ctx is done.
func (h *H2Server) Shutdown(ctx context.Context) error {
	h.stopping.Store(true)
	err := h.hs.Shutdown(ctx)
	lingered := make(chan struct{})
	go func() {
		h.lingering.Wait()
		close(lingered)
	}()
	select {
	case <-lingered:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

// h2ShutdownLinger is how long a connection without a stream stays open
// once the server shuts down: net/http's own wait after a GOAWAY.
const h2ShutdownLinger = time.Second

// connQueue is a listener of the connections fasthttp hands over.
type connQueue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// h2Hop are the fields no HTTP/2 message carries on to an HTTP/1.1 hop.
var h2Hop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// h2Stream is a stream's fasthttp side. Streams reuse them (h2Streams), so
// the request and the response keep their buffers from one stream to the
// next and building them copies bytes without allocating; a stream takes
// one for its handler's run and gives it back before the handler returns.
type h2Stream struct {
	ctx  fasthttp.RequestCtx
	conn h2StreamConn
	buf  []byte // scratch: a joined Cookie field, then the response's fields
}

var h2Streams = sync.Pool{New: func() any { return new(h2Stream) }}

// h2StackGrow is the frame growStack takes: enough that the handler's
// goroutine leaves it with the 16 KiB stack the request path needs (its
// deepest point, the proxy writing the request to the origin, is past
// 8 KiB), not so much that the runtime rounds it up to 32 KiB, which it
// does not keep in its per-CPU caches of stacks.
const h2StackGrow = 12 << 10

// growStack grows the calling goroutine's stack to 16 KiB at once.
//
// net/http runs every stream's handler on a new goroutine, which starts
// with a small stack (an average of the process's goroutines). The
// request path outgrows it deep down, where the runtime's stack copy has
// some forty frames to walk and adjust: a tenth of the edge's CPU over
// HTTP/2 went there. Grown at the handler's entry, the copy walks the few
// frames of net/http's handler call instead. (fasthttp's workers are
// long-lived goroutines whose stacks grew once: HTTP/1.1 does not pay
// this.)
//
//go:noinline
func growStack() {
	var frame [h2StackGrow]byte
	keepFrame(frame[:])
}

//go:noinline
func keepFrame(b []byte) { _ = b }

// serveStream runs one stream through the request path.
func (h *H2Server) serveStream(w http.ResponseWriter, r *http.Request) {
	growStack()
	mc, _ := r.Context().Value(h2ConnKey{}).(*h2MeteredConn)
	if mc == nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	extra, ok := mc.streams.open()
	if !ok {
		h.refuse(w, mc, r, h2RefusedPerIP)
		return
	}
	defer mc.streams.done(extra)
	if !h.held.room(mc.streams.client) {
		h.refuse(w, mc, r, h2RefusedHeldBytes)
		return
	}
	st := h2Streams.Get().(*h2Stream)
	st.conn = h2StreamConn{Conn: mc.Conn, state: &mc.state, ctx: r.Context()}
	ctx := &st.ctx
	ctx.Init2(&st.conn, fastHTTPLogger{Log: h.cfg.Log}, false)
	req := &ctx.Request
	req.Header.SetMethod(r.Method)
	req.SetRequestURI(r.RequestURI)
	// The hop to the origin is HTTP/1.1 (the screen passes it like any
	// HTTP/1.1 request).
	req.Header.SetProtocolBytes(http11)
	req.Header.SetHost(r.Host) // :authority (or a Host field without one)
	for k, vs := range r.Header {
		if h2Hop[k] || k == "Host" {
			continue
		}
		if k == "Cookie" && len(vs) > 1 {
			// HTTP/2 splits cookies into fields; HTTP/1.1 has one (RFC 9113 §8.2.3).
			st.buf = append(st.buf[:0], vs[0]...)
			for _, v := range vs[1:] {
				st.buf = append(append(st.buf, "; "...), v...)
			}
			req.Header.AddBytesV(k, st.buf)
			continue
		}
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	switch {
	case r.ContentLength > 0:
		req.SetBodyStream(r.Body, int(r.ContentLength))
	case r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody:
		req.SetBodyStream(r.Body, -1)
	}

	h.cfg.Handler(ctx)

	resp := &ctx.Response
	var held int64 // what the body holds of the budget until it is written
	// A streamed body (an origin's large or unknown-length one) is never
	// held whole: it is copied as it arrives, a piece at a time (Body
	// would read it all into memory).
	if n := heldBody(resp); r.Method != http.MethodHead && n >= h2HeldMin {
		if h.held.take(mc.streams.client, n) {
			held = n
		} else {
			h.streams.refused.WithLabelValues(h2RefusedHeldBytes).Inc()
			tooLargeToHold(ctx)
		}
	}
	h.writeHeader(w, st, r.Method)
	if r.Method != http.MethodHead {
		h.writeBody(w, resp)
	}
	h.held.release(mc.streams.client, held)
	req.Reset() // closes the request body stream
	resp.Reset()
	st.conn = h2StreamConn{}
	h2Streams.Put(st) // not on a panic: a stream in an unknown state is not reused
}

// heldBody is the size of a body held in memory (0 for a stream).
func heldBody(resp *fasthttp.Response) int64 {
	if resp.IsBodyStream() {
		return 0
	}
	return int64(len(resp.Body()))
}

// writeHeader hands the response's status and fields to net/http.
// net/http encodes the fields after the handler may have returned, so
// they cannot point into the stream's reused buffers: the names and values
// are copied into one string (one allocation for all of them, where a
// string per name and per value would be two per field).
func (h *H2Server) writeHeader(w http.ResponseWriter, st *h2Stream, method string) {
	resp := &st.ctx.Response
	b, n := st.buf[:0], 0
	for k, v := range resp.Header.All() {
		b = append(append(b, k...), v...)
		n++
	}
	// A streamed body's length is the one declared (-1: unknown, sent
	// as DATA frames until END_STREAM).
	contentLength := resp.Header.ContentLength()
	if !resp.IsBodyStream() {
		contentLength = len(resp.Body())
		if method == http.MethodHead && resp.Header.ContentLength() >= 0 {
			contentLength = resp.Header.ContentLength()
		}
	}
	if contentLength >= 0 {
		b = fasthttp.AppendUint(b, contentLength)
	}
	st.buf = b
	all := string(b)
	vals := make([]string, n+1) // and Content-Length
	out := w.Header()
	i, off := 0, 0
	for k, v := range resp.Header.All() {
		name := http.CanonicalHeaderKey(all[off : off+len(k)]) // no copy when it is canonical already
		off += len(k)
		vals[i] = all[off : off+len(v)]
		off += len(v)
		if !h2Hop[name] {
			if vs, ok := out[name]; ok {
				out[name] = append(vs, vals[i])
			} else {
				out[name] = vals[i : i+1 : i+1]
			}
		}
		i++
	}
	if contentLength >= 0 {
		vals[n] = all[off:]
		out["Content-Length"] = vals[n:]
	}
	w.WriteHeader(resp.StatusCode())
}

// h2StreamConn is the connection a stream's fasthttp request sees: the TLS
// connection's addresses and state (so the origin hop says https), and
// "gone" once the client reset the stream or left.
type h2StreamConn struct {
	net.Conn
	state *tls.ConnectionState
	ctx   context.Context
}

func (c *h2StreamConn) Handshake() error                     { return nil }
func (c *h2StreamConn) ConnectionState() tls.ConnectionState { return *c.state }

// Read and Write are never called: the stream's body and response travel
// through net/http.
func (c *h2StreamConn) Read([]byte) (int, error) {
	return 0, errors.New("http2 stream: no direct read")
}
func (c *h2StreamConn) Write([]byte) (int, error) {
	return 0, errors.New("http2 stream: no direct write")
}
func (c *h2StreamConn) Close() error { return nil }

// gone reports whether the client reset the stream or the connection ended.
func (c *h2StreamConn) gone() bool { return c.ctx.Err() != nil }

// h2MeteredConn is an h2 connection as net/http sees it: the decrypted
// stream (net.Conn only: net/http must not take it for TLS and look for
// ALPN again). It meters the frames both ways (h2_frames.go: net/http
// reads from one goroutine) and fails the read that spends a budget, which
// ends the connection.
type h2MeteredConn struct {
	net.Conn  // the *serverTLSConn
	state     tls.ConnectionState
	closed    chan struct{}
	closeOnce sync.Once
	h2Meter
	streams  *h2ConnStreams // h2_streams.go
	srv      *H2Server
	lingered atomic.Bool
	// registered is set when net/http first reports the connection
	// active: its HTTP/2 server has registered it (connState).
	registered atomic.Bool
}

// Close closes the connection and tells serveConn that net/http is done.
//
// Once the server shuts down, net/http closes a connection with no stream
// open at once, while the GOAWAY it sends may still be on its way: a
// request the client sends meanwhile meets a closed socket and fails
// (nothing tells the client it may retry it). So the first such close is
// put off for h2ShutdownLinger: the GOAWAY reaches the client, which sends
// its next requests on a new connection (the next edge's, after an
// upgrade), and net/http's own close after its GOAWAY, or the linger's
// end, closes the socket.
func (c *h2MeteredConn) Close() error {
	if c.srv != nil && c.srv.stopping.Load() && c.lingered.CompareAndSwap(false, true) {
		c.srv.lingering.Add(1)
		time.AfterFunc(h2ShutdownLinger, func() {
			defer c.srv.lingering.Done()
			_ = c.closeNow()
		})
		return nil
	}
	return c.closeNow()
}

func (c *h2MeteredConn) closeNow() error {
	c.goAwayBeforeClose()
	err := c.Conn.Close()
	c.closeOnce.Do(func() { close(c.closed) })
	return err
}
