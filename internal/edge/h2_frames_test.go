package edge

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// floodH2 sends frames with send until the edge ends the connection or max
// went out, and reports how many did, and the GOAWAY code if one came
// (^0 if none: the edge may have closed before the client read it).
func floodH2(t *testing.T, h *rawH2, max int, send func(h *rawH2) error) (sent int, closed bool, goAway http2.ErrCode) {
	t.Helper()
	var err error
	for ; sent < max && err == nil; sent++ {
		err = send(h)
	}
	closed, goAway = h.untilClosed(10 * time.Second)
	return sent, closed || err != nil, goAway
}

var h2GetFields = []string{":method", "GET", ":scheme", "https", ":path", "/", ":authority", "shop.example.com"}

// Frames that do no work spend a budget: past it the connection is closed
// (GOAWAY ENHANCE_YOUR_CALM when the client still reads it) and counted by
// the budget spent; another client on the same edge is served throughout.
func TestH2IdleFrameFloodsCloseTheConnection(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	post := []string{":method", "POST", ":scheme", "https", ":path", "/", ":authority", "shop.example.com"}
	for _, tc := range []struct {
		name, frame string
		open        func(t *testing.T, h *rawH2) // before the flood
		send        func(h *rawH2) error
	}{
		{"WINDOW_UPDATE on the connection", "window_update", nil, func(h *rawH2) error { return h.fr.WriteWindowUpdate(0, 1) }},
		{"WINDOW_UPDATE on a stream waiting for its body", "window_update",
			func(t *testing.T, h *rawH2) { require.NoError(t, h.headers(t, 1, false, post...)) },
			func(h *rawH2) error { return h.fr.WriteWindowUpdate(1, 1) }},
		{"empty DATA", "empty_data",
			func(t *testing.T, h *rawH2) { require.NoError(t, h.headers(t, 1, false, post...)) },
			func(h *rawH2) error { return h.fr.WriteData(1, false, nil) }},
		{"DATA of padding only", "empty_data",
			func(t *testing.T, h *rawH2) { require.NoError(t, h.headers(t, 1, false, post...)) },
			func(h *rawH2) error { return h.fr.WriteDataPadded(1, false, nil, make([]byte, 4)) }},
		{"PING ACK not asked for", "ping_ack", nil, func(h *rawH2) error { return h.fr.WritePing(true, [8]byte{3}) }},
		{"empty CONTINUATION", "continuation",
			func(t *testing.T, h *rawH2) {
				h.buf.Reset()
				for i := 0; i+1 < len(h2GetFields); i += 2 {
					require.NoError(t, h.enc.WriteField(hpack.HeaderField{Name: h2GetFields[i], Value: h2GetFields[i+1]}))
				}
				require.NoError(t, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.buf.Bytes(), EndStream: true}))
			},
			func(h *rawH2) error { return h.fr.WriteContinuation(1, false, nil) }},
		{"unknown frame type", "unknown", nil, func(h *rawH2) error { return h.fr.WriteRawFrame(0xfa, 0, 0, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", tc.frame)
			h := dialRawH2(t, site, r)
			if tc.open != nil {
				tc.open(t, h)
			}
			sent, closed, code := floodH2(t, h, 20_000, tc.send)
			require.True(t, closed, "%d frames sent", sent)
			require.Less(t, sent, 20_000)
			require.Contains(t, []http2.ErrCode{http2.ErrCodeEnhanceYourCalm, ^http2.ErrCode(0)}, code)
			t.Logf("closed after %d frames (GOAWAY %v)", sent, code)
			require.Equal(t, before+1, metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", tc.frame))
		})
	}
	t.Run("another client is served", func(t *testing.T) {
		h := dialRawH2(t, site, r)
		require.NoError(t, h.headers(t, 1, true, h2GetFields...))
		require.Equal(t, 200, h.status(t, 1))
	})
}

// The budget's last frame ends a flood the client then reads: the edge's
// GOAWAY (ENHANCE_YOUR_CALM, the last stream it saw) comes before the end.
func TestH2FloodGetsAGoAway(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	require.NoError(t, h.headers(t, 1, true, h2GetFields...))
	require.Equal(t, 200, h.status(t, 1))
	// One write holding more than the budget, then nothing: the edge has
	// read it all when it closes (no reset for unread bytes).
	var batch bytes.Buffer
	fr := http2.NewFramer(&batch, nil)
	for range 100 + 20 { // past the idle-frame burst (100)
		require.NoError(t, fr.WriteRawFrame(0xfa, 0, 0, nil))
	}
	_, err := h.c.Write(batch.Bytes())
	require.NoError(t, err)
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err, "the connection ended without a GOAWAY")
		if g, ok := f.(*http2.GoAwayFrame); ok {
			require.Equal(t, http2.ErrCodeEnhanceYourCalm, g.ErrCode)
			require.Equal(t, uint32(1), g.LastStreamID)
			break
		}
	}
	_, err = h.fr.ReadFrame()
	require.Error(t, err, "nothing after the GOAWAY")
}

// A client downloading large bodies sends the WINDOW_UPDATEs its reads
// call for, and pings: none of it spends a budget.
func TestH2LargeDownloadsAreNotAFlood(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	origin := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBody(big) }}
	go func() { _ = origin.Serve(ln) }()
	t.Cleanup(func() { _ = origin.Shutdown() })
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) { c.Origins = []string{"http://" + ln.Addr().String()} })
	c := h2Client(site, r)
	for i := range 8 {
		resp, err := c.Get("https://shop.example.com/big")
		require.NoError(t, err, "download %d; floods %s", i, scrapeLines(t, r, "edgeguard_tls_h2_floods_total"))
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "floods %s", scrapeLines(t, r, "edgeguard_tls_h2_floods_total"))
		require.Equal(t, int64(len(big)), n)
	}
	t.Logf("floods %s", scrapeLines(t, r, "edgeguard_tls_h2_floods_total"))
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_connections_total", "protocol", "h2"), "one connection for all")
	require.Zero(t, metricSum(t, r, "edgeguard_tls_h2_floods_total"))
}

// RFC 9113 §8.2.2: a request with a connection-specific field, or a TE
// other than "trailers", is malformed: its stream is reset with
// PROTOCOL_ERROR, it never reaches the origin, and the connection (its
// HPACK tables in step) serves on.
func TestH2ConnectionSpecificFieldsResetTheStream(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	proxied := func() float64 { return metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "proxied") }
	id := uint32(1)
	for _, tc := range []struct {
		name   string
		fields []string
		reset  bool
	}{
		{"connection", []string{"connection", "keep-alive"}, true},
		{"keep-alive", []string{"keep-alive", "timeout=5"}, true},
		{"proxy-connection", []string{"proxy-connection", "keep-alive"}, true},
		{"transfer-encoding", []string{"transfer-encoding", "chunked"}, true},
		{"upgrade", []string{"upgrade", "websocket"}, true},
		{"te: gzip", []string{"te", "gzip"}, true},
		{"te: trailers, deflate", []string{"te", "trailers, deflate"}, true},
		{"te twice", []string{"te", "trailers", "te", "trailers"}, true},
		{"te: trailers", []string{"te", "trailers"}, false},
		{"ordinary fields", []string{"accept", "*/*", "x-a", strings.Repeat("b", 100)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := proxied()
			// Every field enters the dynamic table, so the edge's decoder
			// and net/http's must stay in step for later streams.
			require.NoError(t, h.headers(t, id, true, append(append([]string{}, h2GetFields...), tc.fields...)...))
			if tc.reset {
				code, ok := h.reset(t, id)
				require.True(t, ok, "stream %d answered", id)
				require.Equal(t, http2.ErrCodeProtocol, code)
				require.Equal(t, before, proxied(), "a malformed request reached the origin")
			} else {
				require.Equal(t, 200, h.status(t, id))
			}
			id += 2
			require.NoError(t, h.headers(t, id, true, h2GetFields...))
			require.Equal(t, 200, h.status(t, id), "the connection serves on")
			id += 2
		})
	}
	t.Run("in a CONTINUATION, with padding and priority", func(t *testing.T) {
		h.buf.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":path", "/"}, {":authority", "shop.example.com"}, {"upgrade", "h2c"}} {
			require.NoError(t, h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
		}
		block := h.buf.Bytes()
		require.NoError(t, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:5], EndStream: true, PadLength: 7,
			Priority: http2.PriorityParam{Weight: 10}}))
		require.NoError(t, h.fr.WriteContinuation(id, true, block[5:]))
		code, ok := h.reset(t, id)
		require.True(t, ok)
		require.Equal(t, http2.ErrCodeProtocol, code)
		id += 2
		require.NoError(t, h.headers(t, id, true, h2GetFields...))
		require.Equal(t, 200, h.status(t, id))
	})
}

// reset reads frames until stream id's end: its RST_STREAM code, or false
// if it was answered.
func (h *rawH2) reset(t *testing.T, id uint32) (http2.ErrCode, bool) {
	t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				return 0, false
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return f.ErrCode, true
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, h.fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v before stream %d's end", f.ErrCode, id)
		}
	}
}

// RFC 9113 §6.5.3: a SETTINGS frame naming a setting twice is processed in
// order and acknowledged; the last value holds.
func TestH2SettingsNamedTwiceLastWins(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	require.NoError(t, h.fr.WriteSettings(
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3},
	))
	require.NoError(t, h.headers(t, 1, true, h2GetFields...))
	acked := false
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				acked = true
			} else {
				require.NoError(t, h.fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.DataFrame:
			require.True(t, acked, "the SETTINGS acknowledged")
			require.Len(t, f.Data(), 3, "the stream's window is the last value")
			return
		}
	}
}

// Resets the server sends for the client's protocol errors (here a
// WINDOW_UPDATE of 0 on a stream whose request is in) spend the reset
// budget: the flood is closed and counted, and what reached the origin is
// bounded by the budget, not by what the client sent.
func TestH2ProvokedResetsSpendTheResetBudget(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	h.fr.AllowIllegalWrites = true // a WINDOW_UPDATE of 0
	sent := 0
	var werr error
	start := time.Now()
	for id := uint32(1); id < 40_000 && werr == nil; id += 2 {
		werr = h.headers(t, id, true, ":method", "GET", ":scheme", "https", ":path", "/slow?ms=50", ":authority", "shop.example.com")
		if werr == nil {
			werr = h.fr.WriteWindowUpdate(id, 0)
		}
		sent++
	}
	closed := werr != nil
	if !closed {
		closed, _ = h.untilClosed(10 * time.Second)
	}
	took := time.Since(start)
	require.True(t, closed, "the edge kept a connection whose %d streams it reset", sent)
	t.Logf("sent %d; floods %s", sent, scrapeLines(t, r, "edgeguard_tls_h2_floods_total"))
	require.Less(t, sent, 20_000)
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "provoked_resets")+
		metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "early_resets"))
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "provoked_resets"))
	last := -1.0
	require.Eventually(t, func() bool { // the closed connection's handlers end
		n := metricSum(t, r, "edgeguard_edge_requests_total")
		stable := n == last
		last = n
		return stable
	}, 10*time.Second, 200*time.Millisecond)
	bound := 200 + 100*took.Seconds() + 50 // the reset budget: a burst of 200, 100 a second
	require.LessOrEqual(t, last, bound, "%d streams sent in %s", sent, took)
	t.Logf("closed after %d streams; %.0f reached the request path (bound %.0f) in %s", sent, last, bound, took.Round(time.Millisecond))
}

// net/http's own rapid-reset defence (its queue of handlers not yet
// started) is counted as early_resets.
func TestH2EarlyResetsAreCounted(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) { c.H2MaxStreams = 2 })
	h := dialRawH2(t, site, r)
	// Streams whose handlers take 3 s, each reset at once: past 2 running
	// and 8 waiting, net/http ends the connection (well inside the edge's
	// own budget of h2ResetBurst).
	var werr error
	for id := uint32(1); id < 2*40 && werr == nil; id += 2 {
		werr = h.headers(t, id, true, ":method", "GET", ":scheme", "https", ":path", "/slow?ms=3000", ":authority", "shop.example.com")
		if werr == nil {
			werr = h.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
	}
	closed, code := h.untilClosed(10 * time.Second)
	require.True(t, closed || werr != nil)
	t.Logf("GOAWAY %v", code)
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "early_resets"))
	require.Zero(t, metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "rst_stream"))
}

func scrapeLines(t *testing.T, r *running, prefix string) string {
	var out []string
	for _, l := range strings.Split(scrape(t, r), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// A TLS connection that negotiates h2 after the HTTP/2 server began
// shutting down (its handshake finished late: the old edge of an upgrade,
// or any edge in its drain) is not served, and its client may already
// have sent a request on it. The edge tells it no stream was processed,
// with its SETTINGS and then a GOAWAY of last stream 0 (NO_ERROR), so the
// client sends the request again on another connection; a bare close
// failed it ("unexpected EOF" in Go's client, seen in
// TestUpgradesLoseNoRequest under load).
func TestH2ConnectionAfterShutdownGetsAGoAway(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, noRules, nil)
	// Only the HTTP/2 server shuts down: the TLS listener still hands over
	// the connections that negotiate h2.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.front.TLS.HTTP2().Shutdown(ctx))

	h := dialRawH2(t, site, r)
	require.NoError(t, h.headers(t, 1, true, h2GetFields...))
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := h.fr.ReadFrame()
	require.NoError(t, err, "the connection ended without a frame")
	require.IsType(t, &http2.SettingsFrame{}, f, "the server's preface first")
	f, err = h.fr.ReadFrame()
	require.NoError(t, err, "the connection ended without a GOAWAY")
	g, ok := f.(*http2.GoAwayFrame)
	require.True(t, ok, "want a GOAWAY, got %v", f)
	require.Equal(t, http2.ErrCodeNo, g.ErrCode)
	require.Zero(t, g.LastStreamID, "no stream processed: the client may send stream 1 again")
	_, err = h.fr.ReadFrame()
	require.Error(t, err, "nothing after the GOAWAY")

	// Go's client sends the request again on a new connection: its first
	// dial reaches this edge, the next another edge (an upgrade's new one).
	next, _ := startTLSEdge(t, site, noRules, nil)
	var dials atomic.Int32
	c := h2ClientVia(site, func(ctx context.Context) (net.Conn, error) {
		to := next.TLSAddr()
		if dials.Add(1) == 1 {
			to = r.TLSAddr()
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", to)
	})
	resp, body := h2Get(t, c, "https://shop.example.com/")
	require.Equal(t, 200, resp.StatusCode, string(body))
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, int32(2), dials.Load(), "sent again on a second connection")
}
