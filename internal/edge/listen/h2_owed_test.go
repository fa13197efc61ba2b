package listen

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// stalledConn holds the server's writes while held is set, as a client
// that reads nothing does once the socket's buffers are full, or as a
// writer goroutine the scheduler has not yet run does; a held write ends
// at the write deadline, as one on a full socket does, the deadline set
// while it waits included.
type stalledConn struct {
	net.Conn
	held      atomic.Bool
	holding   chan struct{} // closed when a write is first held
	holdOnce  sync.Once
	release   chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	deadline  time.Time     // the write deadline
	moved     chan struct{} // closed when the deadline changes
}

func (c *stalledConn) Write(b []byte) (int, error) {
	for c.held.Load() {
		c.holdOnce.Do(func() { close(c.holding) })
		c.mu.Lock()
		d, moved := c.deadline, c.moved
		c.mu.Unlock()
		var expired <-chan time.Time
		if !d.IsZero() {
			tm := time.NewTimer(time.Until(d))
			defer tm.Stop()
			expired = tm.C
		}
		select {
		case <-c.release:
			return c.Conn.Write(b)
		case <-c.closed:
			return 0, net.ErrClosed
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		case <-moved:
		}
	}
	return c.Conn.Write(b)
}

func (c *stalledConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	close(c.moved)
	c.moved = make(chan struct{})
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *stalledConn) SetDeadline(t time.Time) error {
	_ = c.SetWriteDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *stalledConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// h2Stalled is an HTTP/2 server (MaxStreams 100) serving handler, and
// one client connection, whose server side holds its writes from the end
// of its handshake if hold is set (its first write, net/http's SETTINGS,
// is under way when newH2Stalled returns).
type h2Stalled struct {
	srv    *H2Server
	conn   *stalledConn
	meter  *h2MeteredConn
	client *tls.Conn
	fr     *http2.Framer
	next   uint32 // the next stream the client opens
}

func newH2Stalled(t *testing.T, handler fasthttp.RequestHandler, hold bool) *h2Stalled {
	ca, cert, ln := h2TestSite(t)
	cfg := testH2Config(handler)
	cfg.Addr, cfg.MaxStreams = ln.Addr(), 100
	s := &h2Stalled{srv: newH2Server(cfg), next: 1}
	metered := make(chan *h2MeteredConn, 1)
	connContext := s.srv.hs.ConnContext
	s.srv.hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		metered <- c.(*h2MeteredConn)
		return connContext(ctx, c)
	}
	go func() { _ = s.srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
	})
	accepted := make(chan *stalledConn, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		sc := &stalledConn{Conn: raw, holding: make(chan struct{}), release: make(chan struct{}), closed: make(chan struct{}), moved: make(chan struct{})}
		tc := tls.Server(sc, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
		if tc.Handshake() != nil {
			return
		}
		sc.held.Store(hold)
		accepted <- sc
		_ = s.srv.ServeConn(&serverTLSConn{Conn: tc, done: true})
	}()
	var err error
	s.client, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "shop.example.com", RootCAs: ca.Pool, NextProtos: []string{"h2"}})
	require.NoError(t, err)
	t.Cleanup(func() { s.client.Close() })
	require.NoError(t, s.client.SetDeadline(time.Now().Add(20*time.Second)))
	s.conn = <-accepted
	_, err = io.WriteString(s.client, http2.ClientPreface)
	require.NoError(t, err)
	s.fr = http2.NewFramer(s.client, s.client)
	require.NoError(t, s.fr.WriteSettings())
	s.meter = <-metered
	if hold { // the server's first write (its SETTINGS) is held: no write comes after
		select {
		case <-s.conn.holding:
		case <-time.After(10 * time.Second):
			t.Fatal("the server never wrote")
		}
	}
	return s
}

// open opens n more of the client's streams, each a whole GET; it stops
// at the first write that fails.
func (s *h2Stalled) open(t *testing.T, n int) (opened int, err error) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range n {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "shop.example.com"}} {
			require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
		}
		if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.next, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			return i, err
		}
		s.next += 2
	}
	return n, nil
}

// owed reads the meter's count of resets spent before they were written.
func (s *h2Stalled) owed() int {
	s.meter.mu.Lock()
	defer s.meter.mu.Unlock()
	return s.meter.resetsOwed
}

func floodCounts(m *H2Metrics) map[string]float64 {
	out := map[string]float64{}
	for _, l := range h2FloodFrames {
		if v := testutil.ToFloat64(m.floods.WithLabelValues(l)); v != 0 {
			out[l] = v
		}
	}
	return out
}

// A client that opens streams past the limit while the server's writes
// are held (it reads nothing) spends the reset budget on each stream
// net/http will refuse, as it opens it: the connection is counted as
// provoked_resets and closed, long before net/http's own bound of 10,000
// queued frames, which closes a connection uncounted. Without the early
// spend, the held writes spend nothing and the connection stays open.
func TestH2ResetsOwedWhileWritesStallSpendTheBudget(t *testing.T) {
	s := newH2Stalled(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }, true)
	opened, err := s.open(t, 2000)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(floodCounts(s.srv.m)) > 0 }, 10*time.Second, 2*time.Millisecond,
		"no flood counted while %d streams were opened", opened)
	require.Equal(t, map[string]float64{"provoked_resets": 1}, floodCounts(s.srv.m))
	require.LessOrEqual(t, s.owed(), opened-100)
	// The client reads again: the connection ends (with a GOAWAY when the
	// write held came back before its deadline).
	close(s.conn.release)
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection was kept: %v", err)
			break
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			require.Equal(t, http2.ErrCodeEnhanceYourCalm, g.ErrCode)
		}
	}
}

// Streams past the limit spend the budget once: a reset spent early is
// paid off when net/http writes it, and spends nothing more. And a client
// within the limit owes nothing, however long the writes are held.
func TestH2ResetsOwedAreSpentOnce(t *testing.T) {
	s := newH2Stalled(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }, true)
	const refused = 150 // under the burst of 200: no flood
	_, err := s.open(t, 100)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s.meter.mu.Lock()
		defer s.meter.mu.Unlock()
		return s.meter.unanswered == 100
	}, 10*time.Second, time.Millisecond)
	require.Zero(t, s.owed(), "100 streams open: none refused")
	more, err := s.open(t, refused)
	require.NoError(t, err)
	opened := 100 + more
	require.Eventually(t, func() bool { return s.owed() == refused }, 10*time.Second, time.Millisecond)

	// Release the writes: net/http answers the first 100 streams (it ran them)
	// and resets the rest; read until every stream has ended.
	t0 := time.Now()
	tokens0 := s.meter.resets.TokensAt(t0)
	close(s.conn.release)
	ended, resets := map[uint32]bool{}, 0
	for len(ended) < opened {
		f, err := s.fr.ReadFrame()
		require.NoError(t, err, "%d of %d streams ended", len(ended), opened)
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			require.NotEqual(t, http2.ErrCodeNo, f.ErrCode)
			ended[f.StreamID] = true
			resets++
		case *http2.DataFrame:
			if f.StreamEnded() {
				ended[f.StreamID] = true
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				ended[f.StreamID] = true
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, s.fr.WriteSettingsAck())
			}
		}
	}
	t1 := time.Now()
	require.Equal(t, refused, resets)
	require.Zero(t, s.owed(), "every reset written paid off one owed")
	require.Empty(t, floodCounts(s.srv.m))
	// No token was taken since t0: the written resets were paid for.
	want := min(float64(h2ResetBurst), tokens0+h2ResetRate*t1.Sub(t0).Seconds())
	require.InDelta(t, want, s.meter.resets.TokensAt(t1), 1e-6)
}

// Once the server has written its GOAWAY, net/http ignores the streams a
// client opens past it, and owes no reset for them: however many come,
// none spends the budget.
func TestH2NoResetOwedAfterTheGoAway(t *testing.T) {
	running, unblock := make(chan struct{}), make(chan struct{})
	s := newH2Stalled(t, func(ctx *fasthttp.RequestCtx) {
		close(running)
		<-unblock
	}, false)
	_, err := s.open(t, 1) // holds the connection open through the shutdown
	require.NoError(t, err)
	<-running
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- s.srv.Shutdown(ctx) }()
	for {
		f, err := s.fr.ReadFrame()
		require.NoError(t, err)
		if g, ok := f.(*http2.GoAwayFrame); ok {
			require.Equal(t, http2.ErrCodeNo, g.ErrCode)
			break
		}
	}
	_, err = s.open(t, 100+2*h2ResetBurst)
	require.NoError(t, err)
	last := s.next - 2
	require.Eventually(t, func() bool { return s.meter.last.Load() == last }, 10*time.Second, time.Millisecond)
	require.Zero(t, s.owed())
	require.Empty(t, floodCounts(s.srv.m))
	close(unblock)
	require.NoError(t, <-shut)
}

// endStreams reads s's frames until each stream from..to (odd) has ended,
// and returns how many of them were reset.
func (s *h2Stalled) endStreams(t *testing.T, from, to uint32) (resets int) {
	t.Helper()
	ended := map[uint32]bool{}
	for len(ended) < int(to-from)/2+1 {
		f, err := s.fr.ReadFrame()
		require.NoError(t, err, "%d streams ended", len(ended))
		id := f.Header().StreamID
		if id != 0 && (id < from || id > to) {
			continue
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			ended[id] = true
			resets++
		case *http2.DataFrame:
			ended[id] = ended[id] || f.StreamEnded()
		case *http2.HeadersFrame:
			ended[id] = ended[id] || f.StreamEnded()
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, s.fr.WriteSettingsAck())
			}
		}
	}
	return resets
}

// A client within the limit owes no reset: one that opens the limit's
// worth of streams again each time the last are answered, and one that
// resets the streams it opened, while the server's writes are held, and
// opens as many again.
func TestH2NoResetOwedWithinTheLimit(t *testing.T) {
	ok := func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }
	t.Run("answered before the next", func(t *testing.T) {
		s := newH2Stalled(t, ok, false)
		refused := 0
		for range 5 {
			from := s.next
			_, err := s.open(t, 100)
			require.NoError(t, err)
			// net/http may refuse a few: it counts a stream open until
			// its serve loop has seen the write of its end, which the
			// client can read first.
			refused += s.endStreams(t, from, s.next-2)
		}
		t.Logf("net/http refused %d of 500 streams", refused)
		require.Zero(t, s.owed())
		require.Empty(t, floodCounts(s.srv.m))
	})
	t.Run("reset by the client", func(t *testing.T) {
		s := newH2Stalled(t, ok, true)
		_, err := s.open(t, 100)
		require.NoError(t, err)
		for id := uint32(1); id < s.next; id += 2 {
			require.NoError(t, s.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}
		from := s.next
		_, err = s.open(t, 100)
		require.NoError(t, err)
		last := s.next - 2
		require.Eventually(t, func() bool { return s.meter.last.Load() == last }, 10*time.Second, time.Millisecond)
		require.Zero(t, s.owed())
		require.Empty(t, floodCounts(s.srv.m))
		// And net/http agrees: it answers each of the new streams.
		close(s.conn.release)
		require.Zero(t, s.endStreams(t, from, last))
	})
}
