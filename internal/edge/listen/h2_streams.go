package listen

import (
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
)

// What an HTTP/2 stream may cost beyond its worker, bounded like a
// connection's:
//
//   - Streams count against --max-conns-per-ip. A connection's slot
//     covers one stream in progress; each stream beyond that takes one
//     more slot of its client address while it runs, so an address holds
//     at most --max-conns-per-ip requests in progress whatever the
//     protocol (nginx's limit_conn counts each HTTP/2 stream as a
//     connection). A stream over the cap is answered 429 before it takes
//     a worker.
//   - Every write of a response makes progress or ends the stream: each
//     piece of the body (h2WritePiece) must be taken by the client within
//     --write-timeout, or the stream is reset (RST_STREAM INTERNAL_ERROR).
//     A client that keeps its flow-control window at zero, or stops
//     reading, holds a response for that long and no longer.
//   - Response bodies waiting on their client are held within a budget,
//     --h2-max-held-bytes for the edge and an eighth of it for one client
//     address (a connection from a trusted proxy is a client of its own);
//     a client holding nothing may always take one response the edge has
//     room for. A stream whose client (or the edge) is at its bound is
//     answered 503 before any origin work; one whose response does not fit
//     when it arrives is answered 503 in its place. The bytes are taken
//     before the write and given back when it ends, so a streamed body
//     keeps the bound by taking each buffer it fills.

// h2WritePiece is the most one write hands net/http at once: the client
// must take this much within --write-timeout. It is one default-sized
// DATA frame; a client reading more slowly than 16 KiB per write timeout
// (1.6 KB/s at the default 10 s) is not served over HTTP/2.
const h2WritePiece = 16 << 10

// h2HeldMin is the smallest body the budget counts: net/http copies a
// shorter one whole into the stream's own 4 KiB buffer
// (handlerChunkWriteSize) and the edge's is free when the handler returns.
const h2HeldMin = 4 << 10

// h2ClientShare: one client address holds at most 1/h2ClientShare of
// --h2-max-held-bytes.
const h2ClientShare = 8

// H2StreamMetrics are the series of what streams hold.
type H2StreamMetrics struct {
	held          prometheus.Gauge
	writeTimeouts prometheus.Counter
	refused       *prometheus.CounterVec // reason
}

// Reasons a stream is refused (the refused metric's label).
const (
	h2RefusedPerIP     = "per_ip"
	h2RefusedHeldBytes = "held_bytes"
)

// newH2StreamMetrics makes the series of what streams hold.
func newH2StreamMetrics() *H2StreamMetrics {
	m := &H2StreamMetrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_tls_h2_held_bytes",
			Help: "HTTP/2 response bytes the edge holds for streams whose client has not taken them yet (bounded by --h2-max-held-bytes).",
		}),
		writeTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_tls_h2_write_timeouts_total",
			Help: "HTTP/2 streams reset because their client took no piece of the response within --write-timeout (flow-control window at zero, or not reading).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_tls_h2_streams_refused_total",
			Help: "HTTP/2 streams refused: per_ip (429: the client address holds --max-conns-per-ip connections and streams in progress), held_bytes (503: the client address or the edge holds its share of --h2-max-held-bytes).",
		}, []string{"reason"}),
	}
	for _, r := range []string{h2RefusedPerIP, h2RefusedHeldBytes} {
		m.refused.WithLabelValues(r)
	}
	return m
}

// Collectors are the series to register.
func (m *H2StreamMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.held, m.writeTimeouts, m.refused}
}

// clientOf is addr's key under the per-client cap, or ok false for a
// trusted proxy (or an address that does not parse): admit's reading of
// an address, without taking a slot.
func (l *ConnCounts) clientOf(addr net.Addr) (key netip.Addr, ok bool) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil || l.trusted.Contains(ap.Addr()) {
		return netip.Addr{}, false
	}
	key = ap.Addr().Unmap()
	if key.Is6() {
		key = netip.PrefixFrom(key, l.v6Bits).Masked().Addr()
	}
	return key, true
}

// take takes one more slot for key, unless it holds its share.
func (l *ConnCounts) take(key netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return false
	}
	l.open[key]++
	return true
}

// h2ConnStreams is what one h2 connection's streams hold: their count
// (against the per-client cap) and their client's share of the budget.
type h2ConnStreams struct {
	counts *ConnCounts // nil: not Capped (a trusted proxy, or no cap)
	key    netip.Addr
	active atomic.Int32
	client *heldClient
	budget *h2Budget
}

// openConnStreams sets up a new connection's stream accounting.
func (h *H2Server) openConnStreams(c net.Conn) *h2ConnStreams {
	cs := &h2ConnStreams{budget: h.held}
	key, ok := h.cfg.Counts.clientOf(c.RemoteAddr())
	if ok && h.cfg.Counts.max > 0 {
		cs.counts, cs.key = h.cfg.Counts, key
	}
	cs.client = h.held.client(key, ok)
	return cs
}

// close gives the connection's part of its client record back.
func (cs *h2ConnStreams) close() { cs.budget.leave(cs.client) }

// open counts a stream in; extra says it took a slot of its own (to give
// back with release). ok is false when the client holds its share.
func (cs *h2ConnStreams) open() (extra, ok bool) {
	if cs.active.Add(1) == 1 || cs.counts == nil {
		return false, true // the connection's own slot covers it
	}
	if !cs.counts.take(cs.key) {
		cs.active.Add(-1)
		return false, false
	}
	return true, true
}

// done counts a stream out.
func (cs *h2ConnStreams) done(extra bool) {
	if extra {
		cs.counts.release(cs.key)
	}
	cs.active.Add(-1)
}

// h2Budget bounds the response bytes held for streams: max for the edge,
// share for one client.
type h2Budget struct {
	max, share int64
	gauge      prometheus.Gauge

	mu      sync.Mutex
	held    int64
	peak    int64 // the most held at once
	clients map[netip.Addr]*heldClient
}

// heldClient is one client's part of the budget; guarded by h2Budget.mu.
type heldClient struct {
	key   netip.Addr
	keyed bool // in clients (else one trusted connection's own)
	conns int
	held  int64
}

func newH2Budget(max int64, gauge prometheus.Gauge) *h2Budget {
	return &h2Budget{max: max, share: max / h2ClientShare, gauge: gauge, clients: map[netip.Addr]*heldClient{}}
}

// client is the record of key's client (keyed) or a connection's own.
func (b *h2Budget) client(key netip.Addr, keyed bool) *heldClient {
	if !keyed {
		return &heldClient{conns: 1}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.clients[key]
	if c == nil {
		c = &heldClient{key: key, keyed: true}
		b.clients[key] = c
	}
	c.conns++
	return c
}

// leave drops a connection from its client's record.
func (b *h2Budget) leave(c *heldClient) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.conns--
	b.forget(c)
}

// forget removes an idle client's record.
func (b *h2Budget) forget(c *heldClient) {
	if c.keyed && c.conns == 0 && c.held == 0 {
		delete(b.clients, c.key)
	}
}

// room reports whether c may start a stream: neither it nor the edge holds
// its bound already.
func (b *h2Budget) room(c *heldClient) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held < b.max && (c.held == 0 || c.held < b.share)
}

// take takes n bytes for c, if they fit: within the edge's bound, and
// within c's share unless c holds nothing yet.
func (b *h2Budget) take(c *heldClient, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.max || c.held > 0 && c.held+n > b.share {
		return false
	}
	b.held += n
	c.held += n
	b.peak = max(b.peak, b.held)
	b.gauge.Add(float64(n))
	return true
}

// release gives back n bytes c took.
func (b *h2Budget) release(c *heldClient, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	c.held -= n
	b.gauge.Sub(float64(n))
	b.forget(c)
}

// h2BodyWriter hands a response body to net/http a piece at a time, each
// piece with --write-timeout to be taken by the client: the stream's write
// deadline (net/http resets the stream when it passes) is moved on before
// every piece. A flush that the client took clears it: net/http resets a
// stream at its deadline whatever the stream is doing, and a stream whose
// origin is quiet (an event stream between events, a long poll) has
// nothing in the client's hands.
type h2BodyWriter struct {
	w        http.ResponseWriter
	rc       writeDeadliner // w (what http.ResponseController would call); nil if it has none
	timeout  time.Duration
	deadline time.Time
	armed    bool // the stream has a write deadline (deadline)
	timedOut bool // a write failed at its deadline
}

// writeDeadliner is net/http's HTTP/2 ResponseWriter: SetWriteDeadline
// sets the stream's own write deadline.
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

func (bw *h2BodyWriter) arm() {
	bw.deadline, bw.armed = time.Now().Add(bw.timeout), true
	if bw.rc != nil {
		_ = bw.rc.SetWriteDeadline(bw.deadline)
	}
}

// disarm clears the stream's write deadline: what was written is the
// client's.
func (bw *h2BodyWriter) disarm() {
	bw.armed = false
	if bw.rc != nil {
		_ = bw.rc.SetWriteDeadline(time.Time{})
	}
}

func (bw *h2BodyWriter) Write(p []byte) (int, error) {
	if bw.timedOut {
		return 0, os.ErrDeadlineExceeded
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), h2WritePiece)
		bw.arm()
		m, err := bw.w.Write(p[:k])
		n += m
		if err != nil {
			bw.timedOut = !time.Now().Before(bw.deadline)
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// Flush sends what net/http buffered of the stream to the client: a
// streamed body calls it after every piece it copies, so events reach the
// client as the origin sends them. It runs under the deadline of the
// piece just written, or a fresh one (the header alone), and clears it
// once done: what comes next waits on the origin first.
func (bw *h2BodyWriter) Flush() error {
	f, ok := bw.w.(http.Flusher)
	if !ok {
		return nil
	}
	if !bw.armed {
		bw.arm()
	}
	f.Flush()
	// Flush says nothing of a failure: a flush that took until the
	// deadline was the stream's reset.
	if !time.Now().Before(bw.deadline) {
		bw.timedOut = true
		return os.ErrDeadlineExceeded
	}
	bw.disarm()
	return nil
}

// writeBody writes resp's body to the stream; it reports whether the
// write timeout ended the stream.
func (h *H2Server) writeBody(w http.ResponseWriter, resp *fasthttp.Response) (timedOut bool) {
	streamed := resp.IsBodyStream()
	if !streamed && len(resp.Body()) == 0 {
		return false // the header alone: not held by flow control
	}
	rc, _ := w.(writeDeadliner)
	if streamed { // an origin's body, copied as it arrives (and flushed); armed per piece
		// The header first, under no stream deadline: flow control
		// never holds it (a connection that takes no bytes at all is
		// closed by WriteByteTimeout), so a client whose window is shut
		// gets it before any reset, however late the edge comes to it.
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		bw := &h2BodyWriter{w: w, rc: rc, timeout: h.cfg.WriteTimeout}
		_ = resp.BodyWriteTo(bw)
		timedOut = bw.timedOut
	} else {
		bw := h2BodyWriter{w: w, rc: rc, timeout: h.cfg.WriteTimeout}
		// Armed before the first piece even for a short body: net/http
		// writes that after the handler returns, and the deadline still
		// ends a stream whose client takes nothing.
		bw.arm()
		_, _ = bw.Write(resp.Body())
		timedOut = bw.timedOut
	}
	if timedOut {
		h.streams.writeTimeouts.Inc()
	}
	return timedOut
}

// refuseStream answers a stream the edge does not take on, before the
// request path: 429 over the per-client cap, 503 over the budget.
func (h *H2Server) refuseStream(ctx *fasthttp.RequestCtx, reason string) {
	h.streams.refused.WithLabelValues(reason).Inc()
	if reason == h2RefusedPerIP {
		problem.Write(ctx, problem.Problem{
			Type:   problem.QuotaExceeded,
			Title:  "Too Many Requests",
			Status: fasthttp.StatusTooManyRequests,
			Detail: "too many connections and requests in progress from your address",
		}, 1)
		return
	}
	problem.Unavailable(ctx, "the edge holds its share of responses waiting for your address; retry later", 1)
}

// tooLargeToHold replaces a response that does not fit the budget (after
// the origin's work: without the not-processed mark).
func tooLargeToHold(ctx *fasthttp.RequestCtx) {
	problem.Write(ctx, problem.Problem{
		Type:   problem.ReducedCapacity,
		Title:  "Service Unavailable",
		Status: fasthttp.StatusServiceUnavailable,
		Detail: "the edge holds its share of responses waiting for your address; retry later",
	}, 1)
}

// refuse answers a stream refused before the request path.
func (h *H2Server) refuse(w http.ResponseWriter, mc *h2MeteredConn, r *http.Request, reason string) {
	st := h2Streams.Get().(*h2Stream)
	st.conn = h2StreamConn{Conn: mc.Conn, state: &mc.state, ctx: r.Context()}
	st.ctx.Init2(&st.conn, fastHTTPLogger{Log: h.cfg.Log}, false)
	h.refuseStream(&st.ctx, reason)
	h.writeHeader(w, st, r.Method)
	if r.Method != http.MethodHead {
		h.writeBody(w, &st.ctx.Response)
	}
	st.ctx.Response.Reset()
	st.conn = h2StreamConn{}
	h2Streams.Put(st)
}

// HeldPeak is the most the streams' responses held at once, and how many
// clients hold some now.
func (h *H2Server) HeldPeak() (peak int64, clients int) {
	h.held.mu.Lock()
	defer h.held.mu.Unlock()
	return h.held.peak, len(h.held.clients)
}
