package edge

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// bigOrigin is an origin whose /big?n=N answers N bytes.
func bigOrigin(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		n, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("n")))
		ctx.SetContentType("application/octet-stream")
		ctx.SetBody(make([]byte, n))
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// h2ClientFrom is Go's HTTP/2 client with its connections from src.
func h2ClientFrom(site *tlsSite, r *running, src string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return h2ClientVia(site, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", r.TLSAddr()) })
}

// dialRawH2From is dialRawH2 from a chosen loopback address.
func dialRawH2From(t *testing.T, site *tlsSite, r *running, src string) *rawH2 {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := tls.DialWithDialer(d, "tcp", r.TLSAddr(), &tls.Config{ServerName: "shop.example.com", RootCAs: site.ca.Pool, NextProtos: []string{"h2"}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	h := &rawH2{c: c, fr: http2.NewFramer(c, c)}
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.enc = hpack.NewEncoder(&h.buf)
	require.NoError(t, h.fr.WriteSettings())
	return h
}

// streamEnd is how the edge ended one stream: its :status (0 if none
// came) and the RST_STREAM code, or END_STREAM.
type streamEnd struct {
	status int
	reset  bool
	code   http2.ErrCode
}

// readStreams reads h's frames until each of n streams has ended, never
// granting flow control.
func (h *rawH2) readStreams(t *testing.T, n int) map[uint32]*streamEnd {
	t.Helper()
	got := map[uint32]*streamEnd{}
	ended := 0
	at := func(id uint32) *streamEnd {
		if got[id] == nil {
			got[id] = &streamEnd{}
		}
		return got[id]
	}
	for ended < n {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err, "%d of %d streams ended", ended, n)
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			at(f.StreamID).status, _ = strconv.Atoi(f.PseudoValue("status"))
			if f.StreamEnded() {
				ended++
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				ended++
			}
		case *http2.RSTStreamFrame:
			s := at(f.StreamID)
			s.reset, s.code = true, f.ErrCode
			ended++
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, h.fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v with %d of %d streams ended", f.ErrCode, ended, n)
		}
	}
	return got
}

// The zero-window attack, scaled down: clients that set
// SETTINGS_INITIAL_WINDOW_SIZE to 0 and never send WINDOW_UPDATE open
// streams for a 1 MiB object. The object streams from the origin (it is
// larger than the bodies read whole), so it holds nothing of
// --h2-max-held-bytes: every stream gets the object's header, and each is
// reset once --write-timeout passes without progress, its origin
// connection let go.
func TestH2ZeroWindowStreamsEnd(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	const object, budget = 1 << 20, 3 << 19
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) {
		c.Origins = []string{bigOrigin(t)}
		c.WriteTimeout = time.Second
		c.H2MaxHeldBytes = budget
	})
	const conns, streams = 2, 20
	var wg sync.WaitGroup
	ends := make([]map[uint32]*streamEnd, conns)
	for i := range conns {
		h := dialRawH2From(t, site, r, "127.0.0."+strconv.Itoa(1+2*i))
		require.NoError(t, h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}))
		for s := range streams {
			require.NoError(t, h.headers(t, uint32(2*s+1), true, ":method", "GET", ":scheme", "https",
				":path", "/big?n="+strconv.Itoa(object), ":authority", "shop.example.com"))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ends[i] = h.readStreams(t, streams)
		}()
	}
	wg.Wait()

	for i, e := range ends {
		require.Len(t, e, streams)
		for id, s := range e {
			require.Equal(t, 200, s.status, "conn %d stream %d", i, id)
			require.True(t, s.reset, "conn %d stream %d ended without a reset: %+v", i, id, s)
			require.Equal(t, http2.ErrCodeInternal, s.code, "conn %d stream %d", i, id)
		}
	}
	// Counted by each stream's handler once its write fails, which is
	// after the reset net/http sent the client: waited for, not read at
	// once (under load, the last handler may not have run yet).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, float64(conns*streams), metricSum(t, r, "edgeguard_tls_h2_write_timeouts_total"))
	}, 10*time.Second, 10*time.Millisecond, "each object's write ended by the timeout")
	require.Equal(t, 0.0, metricSum(t, r, "edgeguard_tls_h2_streams_refused_total", "reason", "held_bytes"))
	require.Eventually(t, func() bool {
		return metricSum(t, r, "edgeguard_origin_streamed_responses_total", "end", "client_write_timeout") == conns*streams
	}, 10*time.Second, 10*time.Millisecond, "every origin connection let go")
	peak, _ := r.front.TLS.HTTP2().HeldPeak()
	require.Zero(t, peak, "a streamed body is never held whole")

	// A client that reads gets the object.
	resp, body := h2Get(t, h2Client(site, r), "https://shop.example.com/big?n="+strconv.Itoa(object))
	require.Equal(t, 200, resp.StatusCode)
	require.Len(t, body, object)
}

// The slow-upload attack: one address opens many HTTP/2 streams whose
// bodies trickle. Its streams count against --max-conns-per-ip, so it
// holds no more workers than that many connections would, and the
// requests of clients at other addresses, over HTTP/1.1 and HTTP/2, all
// succeed while it holds them.
func TestH2StreamsCountAgainstThePerIPCap(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	// 8 workers: the attacker's host and the HTTP/1.1 clients' are two
	// hosts, each with a share of 4 (host shares), which the attacker's 4
	// streams fill. The attacked host's other clients are still served:
	// one address's requests beyond half a share do not count against
	// them (docs/shedding.md).
	const workers, perIP = 8, 4
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) {
		c.Workers = workers
		c.MaxConnsPerIP = perIP
	})
	const conns, streams = 2, 10
	var attackers []*rawH2
	for range conns { // connected first: its streams take the slots of connections to come
		attackers = append(attackers, dialRawH2From(t, site, r, "127.0.0.1"))
	}
	for _, h := range attackers {
		for s := range streams {
			id := uint32(2*s + 1)
			require.NoError(t, h.headers(t, id, false, ":method", "POST", ":scheme", "https",
				":path", "/up", ":authority", "shop.example.com", "content-length", "1000"))
			require.NoError(t, h.fr.WriteData(id, false, []byte{'x'})) // and no more
		}
	}
	// The attacker's connections and streams in progress: perIP in all,
	// each of those streams on a worker; the rest answered 429.
	var refused atomic.Int64
	var readers sync.WaitGroup
	for _, h := range attackers {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				f, err := h.fr.ReadFrame()
				if err != nil {
					return // the deadline below
				}
				switch f := f.(type) {
				case *http2.MetaHeadersFrame:
					if f.PseudoValue("status") != "429" {
						t.Errorf("stream %d answered %s", f.StreamID, f.PseudoValue("status"))
					}
					refused.Add(1)
				case *http2.SettingsFrame:
					if !f.IsAck() {
						_ = h.fr.WriteSettingsAck()
					}
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return refused.Load() == conns*streams-perIP }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return r.shed.Workers.Busy() == perIP }, 10*time.Second, 10*time.Millisecond)
	for _, h := range attackers {
		_ = h.c.SetReadDeadline(time.Now())
	}
	readers.Wait()
	require.Equal(t, int64(conns*streams-perIP), refused.Load())
	require.Equal(t, float64(conns*streams-perIP), metricSum(t, r, "edgeguard_tls_h2_streams_refused_total", "reason", "per_ip"))

	// Others: HTTP/1.1 from 127.0.0.2, HTTP/2 from 127.0.0.3 (each within
	// the cap itself), while the attacker's streams hold their workers.
	const each, clients = 8, 2
	h1, h2c := httpFrom("127.0.0.2"), h2ClientFrom(site, r, "127.0.0.3")
	var wg sync.WaitGroup
	codes := make(chan int, 2*clients*each)
	for range clients {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := h1.Get("http://" + r.Addr() + "/")
				if err != nil {
					codes <- -1
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}
		}()
		go func() {
			defer wg.Done()
			for range each {
				resp, err := h2c.Get("https://shop.example.com/")
				if err != nil {
					codes <- -1
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode*10 + resp.ProtoMajor
			}
		}()
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	require.Equal(t, map[int]int{200: clients * each, 2002: clients * each}, got, "other addresses' requests (status, or status·10+2 over HTTP/2)")
	require.Equal(t, perIP, r.shed.Workers.Busy(), "the attacker's streams were still held")
}
