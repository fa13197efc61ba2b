package origin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/reqhead"
)

// Tunnels carries HTTP/1.1 Upgrade requests (WebSocket and the like) to the
// origin and, when the origin switches protocols, the bytes of both sides
// until either ends. An upgrade is an ordinary request up to its answer:
// the pipeline's stages (screen, trust, shedder, rules, limits) have passed
// it before Serve runs. Serve then:
//
//  1. refuses it with 503 and Retry-After when MaxOpen tunnels are open
//     (before any origin work), or when the edge is shutting down;
//  2. sends it, Upgrade and Connection: upgrade restored after the usual
//     hop-by-hop stripping, on a connection of its own, dialled for it and
//     never taken from or given back to the keep-alive pool;
//  3. on a 101 answer, hands the origin's handshake header to the client
//     and hijacks the client connection (the handler, and its worker,
//     return at once): the tunnel copies bytes both ways, those the origin
//     sent after its 101 header first, until one side closes, neither
//     side sends for IdleTimeout, or End;
//  4. on any other answer, passes it on as an ordinary response read
//     whole (up to 64 MiB) and closes the origin connection: nothing is
//     tunnelled, and the client connection stays HTTP, its next bytes read
//     as its next request.
type Tunnels struct {
	cfg TunnelConfig
	m   *tunnelMetrics

	open atomic.Int64 // reserved or running tunnels

	mu    sync.Mutex
	live  map[*tunnel]struct{}
	ended bool
	empty chan struct{} // closed when live empties (Wait)
}

// TunnelConfig bounds the tunnels of one edge.
type TunnelConfig struct {
	// MaxOpen is how many tunnels may be open at once; past it an upgrade
	// is answered 503 with Retry-After. 0 turns tunnelling off: Upgrade is
	// stripped like any hop-by-hop field and the request proxied as usual.
	MaxOpen int
	// IdleTimeout closes a tunnel in which neither side sent a byte for
	// that long (0: never).
	IdleTimeout time.Duration
}

// TunnelEnd is how a tunnel ended, for the caller's access-log line.
type TunnelEnd struct {
	Reason   string // client_closed, origin_closed, idle_timeout, shutdown, error
	ToOrigin int64  // bytes from the client to the origin
	ToClient int64  // bytes from the origin to the client
	Duration time.Duration
}

// tunnelEnd is why a tunnel ended (the tunnels_total label).
type tunnelEnd int32

const (
	tunnelRunning tunnelEnd = iota
	tunnelClientClosed
	tunnelOriginClosed
	tunnelIdle
	tunnelShutdown
	tunnelError
	numTunnelEnds
)

var tunnelEndNames = [numTunnelEnds]string{"", "client_closed", "origin_closed", "idle_timeout", "shutdown", "error"}

type tunnelMetrics struct {
	open    prometheus.Gauge
	ended   [numTunnelEnds]prometheus.Counter
	refused prometheus.Counter
	bytes   [2]prometheus.Counter // to origin, to client
}

func newTunnelMetrics(reg prometheus.Registerer) (*tunnelMetrics, error) {
	m := &tunnelMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_origin_tunnels_open",
			Help: "Upgraded connections (WebSocket and the like) tunnelled to an origin right now.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_origin_tunnels_refused_total",
			Help: "Upgrade requests answered 503 because --max-tunnels tunnels were open (or the edge was shutting down).",
		}),
	}
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_origin_tunnels_total",
		Help: "Tunnels closed, by how they ended: client_closed, origin_closed, idle_timeout, shutdown, error.",
	}, []string{"end"})
	for e := tunnelClientClosed; e < numTunnelEnds; e++ {
		m.ended[e] = ended.WithLabelValues(tunnelEndNames[e])
	}
	bytesVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_origin_tunnel_bytes_total",
		Help: "Bytes copied through tunnels, by direction: to_origin (from the client) or to_client (from the origin).",
	}, []string{"direction"})
	m.bytes[0], m.bytes[1] = bytesVec.WithLabelValues("to_origin"), bytesVec.WithLabelValues("to_client")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.open, m.refused, ended, bytesVec} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering tunnel metrics: %w", err)
			}
		}
	}
	return m, nil
}

// NewTunnels carries upgrades to the origins of the pool Serve is given,
// up to cfg.MaxOpen at once over every pool. reg may be nil.
func NewTunnels(cfg TunnelConfig, reg prometheus.Registerer) (*Tunnels, error) {
	if cfg.MaxOpen < 0 || cfg.IdleTimeout < 0 {
		return nil, errors.New("tunnels: the cap and the idle timeout must not be negative")
	}
	m, err := newTunnelMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Tunnels{cfg: cfg, m: m, live: make(map[*tunnel]struct{})}, nil
}

// Wants reports whether the request is one Serve tunnels: an HTTP/1.1 GET
// without a body whose Connection names upgrade (and not close) and whose
// Upgrade names a protocol other than h2c. Anything else goes through
// Proxy.Serve, which strips Upgrade: an upgrade with a body is proxied
// without its upgrade, and h2c (HTTP/2 in cleartext, whose streams would
// reach the origin unseen by the rules) is never offered to an origin.
func (t *Tunnels) Wants(ctx *fasthttp.RequestCtx) bool {
	if t == nil || t.cfg.MaxOpen == 0 {
		return false
	}
	h := &ctx.Request.Header
	// A request with no Upgrade field, nearly every one, is told from one
	// look over the names, before any field is asked for by name.
	if !h.IsGet() || !h.IsHTTP11() || h.ConnectionClose() || !reqhead.Holds(h, fasthttp.HeaderUpgrade) || !h.ConnectionUpgrade() {
		return false
	}
	if ctx.Request.IsBodyStream() || h.ContentLength() > 0 || len(ctx.Request.Body()) > 0 {
		return false
	}
	for _, v := range h.PeekAll(fasthttp.HeaderConnection) {
		if hasToken(v, "close") {
			return false
		}
	}
	up := h.PeekAll(fasthttp.HeaderUpgrade)
	if len(up) != 1 || len(bytes.TrimSpace(up[0])) == 0 {
		return false
	}
	return !hasToken(up[0], "h2c") && !hasToken(up[0], "h2")
}

// hasToken reports whether the comma-separated list v names tok (case
// aside; a protocol's /version aside).
func hasToken(v []byte, tok string) bool {
	for rest := v; len(rest) > 0; {
		t := rest
		if i := bytes.IndexByte(rest, ','); i >= 0 {
			t, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		t = bytes.TrimSpace(t)
		if i := bytes.IndexByte(t, '/'); i >= 0 {
			t = t[:i]
		}
		if bytes.EqualFold(t, []byte(tok)) {
			return true
		}
	}
	return false
}

var (
	problemTunnelsFull = func() cannedProblem {
		p := newTypedProblem("https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
			fasthttp.StatusServiceUnavailable, "The edge holds as many open upgraded connections as it may; retry later.")
		p.retryAfter = "1"
		return p
	}()
	problemBadUpgrade = newProblem(fasthttp.StatusBadGateway, "The origin switched protocols without naming one.")
)

// maxInterim bounds the 1xx answers (100, 103) skipped before the final
// one.
const maxInterim = 8

// Serve sends an upgrade request (Wants) to an origin of p, the host's
// pool. On a 101 it sets
// ctx.Response to the origin's handshake, hijacks the client connection
// and reports true: the tunnel then runs after the handler returns, and
// hop.AtEnd and done (either may be nil) are called once when it closes.
// Otherwise ctx.Response holds the origin's answer, or a problem, and
// neither is called.
func (t *Tunnels) Serve(ctx *fasthttp.RequestCtx, p *Proxy, hop Hop, done func(TunnelEnd)) bool {
	if t.open.Add(1) > int64(t.cfg.MaxOpen) || t.isEnded() {
		t.open.Add(-1)
		t.m.refused.Inc()
		writeProblem(ctx, problemTunnelsFull)
		return false
	}
	opened := false
	defer func() {
		if !opened {
			t.open.Add(-1)
		}
	}()
	start := time.Now()
	deadline := start.Add(p.cfg.HeaderTimeout)
	if p.cfg.Timeout > 0 && start.Add(p.cfg.Timeout).Before(deadline) {
		deadline = start.Add(p.cfg.Timeout)
	}
	upgrade := append([]byte(nil), ctx.Request.Header.Peek(fasthttp.HeaderUpgrade)...)

	ex := exchangePool.Get().(*exchange)
	defer func() {
		ex.req.Reset()
		ex.resp.Reset()
		ex.release()
	}()
	if !p.prepare(ctx, ex, hop) {
		return false
	}
	req, resp := &ex.req, &ex.resp
	req.Header.Set(fasthttp.HeaderConnection, "Upgrade")
	req.Header.SetBytesV(fasthttp.HeaderUpgrade, upgrade)
	o := p.pick(nil)
	req.URI().SetScheme(o.scheme)
	if p.cfg.RewriteHost || len(ctx.Request.Header.Host()) == 0 {
		req.Header.SetHost(o.host)
	}

	o.pending.Add(1)
	conn, br, err := t.exchange(o, req, resp, deadline)
	o.pending.Add(-1)
	why := classify(err)
	p.countTimeout(why, err, false)
	p.record(o, why, err, hop.RequestID)
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		ctx.Response.Reset()
		switch why {
		case reasonTimeout:
			writeProblem(ctx, problemTimeout)
		case reasonBodyTooLarge:
			writeProblem(ctx, problemTooLarge)
		case reasonConnect:
			writeProblem(ctx, problemConnect)
		default:
			writeProblem(ctx, problemOther)
		}
		return false
	}
	p.metrics.response(resp.StatusCode())
	resp.Header.CopyTo(&ctx.Response.Header)
	stripHopByHop(&ctx.Response.Header, ex)
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		// An ordinary answer, read whole: its connection is closed, never
		// pooled, and nothing is tunnelled.
		_ = conn.Close()
		ctx.Response.SetBody(resp.Body())
		return false
	}
	switched := resp.Header.Peek(fasthttp.HeaderUpgrade)
	if len(bytes.TrimSpace(switched)) == 0 {
		_ = conn.Close()
		ctx.Response.Reset()
		writeProblem(ctx, problemBadUpgrade)
		return false
	}
	ctx.Response.Header.SetBytesV(fasthttp.HeaderUpgrade, switched)
	ctx.Response.Header.Set(fasthttp.HeaderConnection, "Upgrade")
	ctx.Response.SkipBody = true

	tn := &tunnel{t: t, origin: conn, originR: br, atEnd: hop.AtEnd, done: done, start: start}
	if !t.add(tn) {
		_ = conn.Close()
		ctx.Response.Reset()
		t.m.refused.Inc()
		writeProblem(ctx, problemTunnelsFull)
		return false
	}
	opened = true
	t.m.open.Inc()
	// The 101 is written by the tunnel itself: fasthttp skips the hijack
	// handler when it closes the connection after its response (a
	// shutdown, a request limit), which would leave the tunnel and what
	// it holds behind.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { tn.run(c, &ctx.Response.Header) })
	return true
}

// exchange dials o for this request alone, sends req and reads the final
// answer's header into resp (a body only when it is not a 101). The
// reader is the connection's: what the origin sent after a 101 header is
// in it.
func (t *Tunnels) exchange(o *origin, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) (net.Conn, *bufio.Reader, error) {
	raw, err := o.client.DialTimeout(o.client.Addr, time.Until(deadline))
	if err != nil {
		return nil, nil, err
	}
	conn := raw
	if o.client.IsTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.client.TLSConfig != nil {
			cfg = o.client.TLSConfig.Clone()
		}
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(o.client.Addr)
			if err != nil {
				host = o.client.Addr
			}
			cfg.ServerName = host
		}
		cfg.NextProtos = []string{"http/1.1"}
		conn = tls.Client(raw, cfg)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return conn, nil, err
	}
	// The path as received (or as Hop.Path set it), as the origin
	// clients send it: fasthttp would otherwise write it normalised.
	req.URI().DisablePathNormalizing = true
	bw := bufio.NewWriter(conn)
	if err := req.Write(bw); err != nil {
		return conn, nil, err
	}
	if err := bw.Flush(); err != nil {
		return conn, nil, err
	}
	br := bufio.NewReaderSize(conn, 16<<10)
	for i := 0; ; i++ {
		if err := resp.Header.Read(br); err != nil {
			return conn, nil, err
		}
		code := resp.StatusCode()
		if code == fasthttp.StatusSwitchingProtocols || code >= 200 {
			break
		}
		if i >= maxInterim {
			return conn, nil, errors.New("the origin sent too many interim answers")
		}
		resp.Header.Reset()
	}
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		if err := resp.ReadBody(br, maxWholeBody); err != nil {
			return conn, nil, fmt.Errorf("reading the response body: %w", err)
		}
	}
	return conn, br, conn.SetDeadline(time.Time{})
}

func (t *Tunnels) isEnded() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended
}

func (t *Tunnels) add(tn *tunnel) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	t.live[tn] = struct{}{}
	return true
}

func (t *Tunnels) remove(tn *tunnel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.live, tn)
	if len(t.live) == 0 && t.empty != nil {
		close(t.empty)
		t.empty = nil
	}
}

// Wait returns once no tunnel is open (each closed and accounted for),
// or with ctx's error when ctx ends first. A shutdown waits for its
// tunnels with it: fasthttp's does not wait for hijacked connections.
func (t *Tunnels) Wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		if len(t.live) == 0 {
			t.mu.Unlock()
			return nil
		}
		if t.empty == nil {
			t.empty = make(chan struct{})
		}
		ch := t.empty
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// End closes every open tunnel, and refuses those asked for later: a
// shutdown calls it with EndStreams, near the end of its drain, so
// tunnels (which fasthttp's shutdown does not wait for) close within it.
func (t *Tunnels) End() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	for tn := range t.live {
		tn.finish(tunnelShutdown)
	}
}

// Open is how many tunnels are open (or being set up).
func (t *Tunnels) Open() int { return int(t.open.Load()) }

// tunnel is one upgraded connection between a client and an origin.
type tunnel struct {
	t       *Tunnels
	origin  net.Conn
	originR *bufio.Reader
	// closer is what closing ends the client's reads with (the hijacked
	// connection's wrapper closes nothing); set by run, under mu.
	closer net.Conn
	atEnd  func()
	done   func(TunnelEnd)
	start  time.Time

	mu     sync.Mutex
	end    tunnelEnd
	closed bool
	// last is when a byte last went either way (unix nanoseconds): the
	// idle timeout counts from it.
	last  atomic.Int64
	bytes [2]atomic.Int64
}

// upgradedConn is a client connection whose HTTP/1.x reader must stop
// reading requests (the edge's framing check, listen.Upgraded).
type upgradedConn interface{ Upgraded() bool }

// run is the hijack handler: it writes the 101, then copies both ways
// until the tunnel ends, and gives back what it held. fasthttp closes c
// when it returns.
func (tn *tunnel) run(c net.Conn, h *fasthttp.ResponseHeader) {
	closer := c
	if u, ok := c.(interface{ UnsafeConn() net.Conn }); ok {
		closer = u.UnsafeConn()
	}
	tn.mu.Lock()
	tn.closer = closer
	ended := tn.closed // End ran before the hijack
	tn.mu.Unlock()
	if ended {
		tn.close()
		return
	}
	tn.last.Store(time.Now().UnixNano())
	// fasthttp marks the answer Connection: close when it means to close
	// the connection after it; the tunnel owns the connection now.
	h.ResetConnectionClose()
	switch {
	case !upgraded(closer):
		tn.finish(tunnelError)
	default:
		if _, err := c.Write(h.Header()); err != nil {
			tn.finish(tunnelError)
		}
	}
	if tn.ended() == tunnelRunning {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tn.copy(tn.origin, tn.originR, c, 1)
		}()
		tn.copy(c, c, tn.origin, 0)
		wg.Wait()
	}
	tn.close()
}

// upgraded switches off the HTTP/1.x reading of c, wherever it is in c's
// chain of wrappers; false says the switch failed (bytes were refused).
func upgraded(c net.Conn) bool {
	for c != nil {
		if u, ok := c.(upgradedConn); ok {
			return u.Upgraded()
		}
		n, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return true
		}
		c = n.NetConn()
	}
	return true
}

func (tn *tunnel) ended() tunnelEnd {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.end
}

// copy moves bytes from src (read through r) to dst until the tunnel
// ends; dir 0 is client to origin, 1 origin to client.
func (tn *tunnel) copy(src net.Conn, r io.Reader, dst net.Conn, dir int) {
	idle := tn.t.cfg.IdleTimeout
	buf := copyBufs.Get().(*[copyBuf]byte)
	defer copyBufs.Put(buf)
	counter := tn.t.m.bytes[dir]
	for {
		if idle > 0 {
			if err := src.SetReadDeadline(time.Unix(0, tn.last.Load()).Add(idle)); err != nil {
				tn.finish(tunnelError)
				return
			}
		}
		n, rerr := r.Read(buf[:])
		if n > 0 {
			tn.last.Store(time.Now().UnixNano())
			if idle > 0 {
				_ = dst.SetWriteDeadline(time.Now().Add(idle))
			}
			m, werr := dst.Write(buf[:n])
			tn.bytes[dir].Add(int64(m))
			counter.Add(float64(m))
			if werr != nil {
				tn.finish(tunnelError)
				return
			}
		}
		switch {
		case rerr == nil:
			continue
		case isTimeout(rerr) && idle > 0 && time.Since(time.Unix(0, tn.last.Load())) < idle:
			if tn.ended() != tunnelRunning {
				return
			}
			continue // the other direction moved: the tunnel is not idle
		case isTimeout(rerr):
			tn.finish(tunnelIdle)
		case dir == 0:
			tn.finish(tunnelClientClosed)
		default:
			tn.finish(tunnelOriginClosed)
		}
		return
	}
}

// finish records why the tunnel ends (the first reason wins) and closes
// both connections, which ends both copies.
func (tn *tunnel) finish(why tunnelEnd) {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	if tn.end == tunnelRunning {
		tn.end = why
	}
	if tn.closed {
		return
	}
	tn.closed = true
	_ = tn.origin.Close()
	if tn.closer != nil {
		_ = tn.closer.Close()
	}
}

// close gives back what the tunnel held once both copies are done.
func (tn *tunnel) close() {
	tn.finish(tunnelError) // no-op unless nothing ended it yet
	t := tn.t
	defer t.remove(tn) // last: Wait returns with the tunnel accounted for
	t.open.Add(-1)
	t.m.open.Dec()
	end := tn.ended()
	t.m.ended[end].Inc()
	if tn.atEnd != nil {
		tn.atEnd()
	}
	if tn.done != nil {
		tn.done(TunnelEnd{
			Reason:   tunnelEndNames[end],
			ToOrigin: tn.bytes[0].Load(),
			ToClient: tn.bytes[1].Load(),
			Duration: time.Since(tn.start),
		})
	}
}
