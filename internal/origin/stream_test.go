package origin

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startCountingOrigin is a fasthttp origin whose accepted connections are
// counted.
func startCountingOrigin(t *testing.T, h fasthttp.RequestHandler) (string, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: ln}
	s := &fasthttp.Server{Handler: h, CloseOnShutdown: true}
	go s.Serve(cl) //nolint:errcheck // returns when stopped
	t.Cleanup(func() { _ = s.Shutdown() })
	return "http://" + ln.Addr().String(), cl
}

// Small bodies (read whole) and streamed ones (read to their end) both
// leave their origin connection in the pool: one connection serves them
// all, in any mix.
func TestStreamedBodiesKeepConnectionsAlive(t *testing.T) {
	big := strings.Repeat("b", 200<<10)
	url, ln := startCountingOrigin(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/big":
			ctx.SetBodyString(big)
		case "/chunked":
			ctx.SetBodyStream(strings.NewReader("chunked body"), -1)
		default:
			ctx.SetBodyString("small")
		}
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{url}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")
	for range 3 {
		require.Equal(t, "small", string(get(t, edge, "/").Body()))
		require.Equal(t, big, string(get(t, edge, "/big").Body()))
		require.Equal(t, "chunked body", string(get(t, edge, "/chunked").Body()))
	}
	require.Equal(t, int32(1), ln.n.Load(), "one origin connection, reused")
	require.Equal(t, 6.0, counterValue(t, p.metrics.streams[endComplete]))
}

// An origin that goes silent mid-body for longer than ReadIdleTimeout
// ends the response there: the client sees it cut short, the timeout is
// counted by phase, and the origin's connection is closed, not pooled.
func TestStreamReadIdleTimeout(t *testing.T) {
	silent := make(chan struct{})
	url, _ := startCountingOrigin(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("first part\n")
			_ = w.Flush()
			<-silent // then nothing, until the test ends
		})
	})
	t.Cleanup(func() { close(silent) }) // before the origin's shutdown waits for the writer
	cfg := DefaultConfig()
	cfg.URLs = []string{url}
	cfg.HealthCheckInterval = 0
	cfg.ReadIdleTimeout = 200 * time.Millisecond
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	require.NoError(t, err)
	got, err := io.ReadAll(conn) // the edge closes the connection when the stream ends
	require.NoError(t, err)
	require.Contains(t, string(got), "HTTP/1.1 200 OK")
	require.Contains(t, string(got), "first part\n")
	require.NotContains(t, string(got), "\r\n0\r\n\r\n", "no last chunk: the body was cut short")
	require.Equal(t, 1.0, counterValue(t, p.metrics.timeouts[phaseReadIdle]))
	require.Equal(t, 1.0, counterValue(t, p.metrics.streams[endReadIdle]))
	require.Equal(t, 0.0, counterValue(t, p.metrics.timeouts[phaseHeader]))
}

// Timeout, when set, bounds the whole exchange: a stream still moving is
// cut at it, counted as the total phase.
func TestStreamTotalTimeout(t *testing.T) {
	stop := make(chan struct{})
	url, _ := startCountingOrigin(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for {
				if _, err := w.WriteString("tick\n"); err != nil {
					return
				}
				if w.Flush() != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond): // the origin's pace, well inside the idle timeout
				}
			}
		})
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{url}
	cfg.HealthCheckInterval = 0
	t.Cleanup(func() { close(stop) }) // before the origin's shutdown waits for the writer
	cfg.Timeout = 300 * time.Millisecond
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	require.NoError(t, err)
	got, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Contains(t, string(got), "tick\n")
	require.Equal(t, 1.0, counterValue(t, p.metrics.timeouts[phaseTotal]))
	require.Equal(t, 1.0, counterValue(t, p.metrics.streams[endTotal]))
}

// A client that goes away mid-stream ends it: the origin connection is
// closed (the origin's next write fails), and nothing is counted as a
// timeout.
func TestStreamClientGoesAway(t *testing.T) {
	ended := make(chan struct{})
	url, _ := startCountingOrigin(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer close(ended)
			chunk := strings.Repeat("x", 16<<10)
			for {
				if _, err := w.WriteString(chunk); err != nil {
					return
				}
				if w.Flush() != nil {
					return
				}
			}
		})
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{url}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	require.NoError(t, err)
	buf := make([]byte, 64<<10)
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the origin kept writing after the client left")
	}
	require.Eventually(t, func() bool { return counterValue(t, p.metrics.streams[endClient]) == 1 },
		10*time.Second, 10*time.Millisecond)
	for ph := range numPhases {
		require.Equal(t, 0.0, counterValue(t, p.metrics.timeouts[ph]), phaseNames[ph])
	}
}

// EndStreams cuts a stream under way and any that starts later.
func TestEndStreams(t *testing.T) {
	hold := make(chan struct{})
	url, _ := startCountingOrigin(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("data: 1\n\n")
			_ = w.Flush()
			<-hold
		})
	})
	t.Cleanup(func() { close(hold) }) // before the origin's shutdown waits for the writer
	cfg := DefaultConfig()
	cfg.URLs = []string{url}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	open := func() (net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", edge)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
		require.NoError(t, err)
		return conn, bufio.NewReader(conn)
	}
	_, br := open()
	status, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200 OK\r\n", status)
	p.EndStreams()
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the edge closes the connection")
	require.NotContains(t, string(rest), "\r\n0\r\n\r\n", "no last chunk: cut short")

	_, br = open() // after EndStreams: cut at once
	rest, err = io.ReadAll(br)
	require.NoError(t, err)
	require.Contains(t, string(rest), "HTTP/1.1 200 OK")
	require.Equal(t, 2.0, counterValue(t, p.metrics.streams[endShutdown]))
}

// An HTTP/1.0 client cannot take a chunked body: one of unknown length
// (here delimited by the origin closing the connection) is read whole for
// it and sent with its length, as before responses streamed; over the old
// cap it is a 502. An HTTP/1.1 client gets it streamed, chunked.
func TestUnknownLengthForHTTP10(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				n := int64(1000)
				if strings.Contains(line, "/huge") {
					n = maxWholeBody + 1
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
				_, _ = io.Copy(c, io.LimitReader(zeros{}, n))
			}()
		}
	}()
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + ln.Addr().String()}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	resp := rawExchange(t, edge, "GET / HTTP/1.0\nHost: shop.example\n\n")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
	require.Equal(t, 1000, resp.Header.ContentLength())
	require.Len(t, resp.Body(), 1000)

	resp = rawExchange(t, edge, "GET /huge HTTP/1.0\nHost: shop.example\n\n")
	require.Equal(t, fasthttp.StatusBadGateway, resp.StatusCode())
	require.Equal(t, 1.0, counterValue(t, p.metrics.errors[reasonBodyTooLarge]))

	resp = rawExchange(t, edge, "GET / HTTP/1.1\nHost: shop.example\n\n")
	require.Equal(t, -1, resp.Header.ContentLength(), "HTTP/1.1 streams it chunked")
	require.Len(t, resp.Body(), 1000)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// An origin that sends its header and then waits before its body (an
// event stream, a long poll) has the header reach the client at once:
// the edge does not hold it until the body's first bytes come. Both
// framings of a streamed body: a length over smallBody, and chunked.
func TestStreamHeaderBeforeBody(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		body         string
	}{
		{"length", "Content-Length: 100000\r\n", strings.Repeat("b", 100000)},
		{"chunked", "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				for { // the request's header
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						break
					}
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+tc.header+"\r\n")
				<-release
				_, _ = io.WriteString(c, tc.body)
			}()
			cfg := DefaultConfig()
			cfg.URLs = []string{"http://" + ln.Addr().String()}
			cfg.HealthCheckInterval = 0
			p := newProxy(t, cfg)
			edge := startEdge(t, p, "203.0.113.7", "rid")
			t.Cleanup(free) // before the edge's shutdown waits for the stream

			conn, err := net.Dial("tcp", edge)
			require.NoError(t, err)
			defer conn.Close()
			// A bound, not a signal: the header must come while the
			// origin still holds its body, which it does until the test
			// releases it below.
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = io.WriteString(conn, "GET /events HTTP/1.1\r\nHost: shop.example\r\n\r\n")
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			var head strings.Builder
			for {
				line, err := br.ReadString('\n')
				require.NoError(t, err, "the header, while the origin holds its body; got %q", head.String())
				head.WriteString(line)
				if line == "\r\n" {
					break
				}
			}
			require.True(t, strings.HasPrefix(head.String(), "HTTP/1.1 200 OK\r\n"), head.String())
			require.Contains(t, head.String(), "Content-Type: text/event-stream\r\n")

			free()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			// The same response, parsed whole now: the header again (from
			// what was read) and then the body.
			require.NoError(t, resp.Read(bufio.NewReader(io.MultiReader(strings.NewReader(head.String()), br))))
			want := tc.body
			if tc.name == "chunked" {
				want = "hello"
			}
			require.Equal(t, want, string(resp.Body()))
		})
	}
}
