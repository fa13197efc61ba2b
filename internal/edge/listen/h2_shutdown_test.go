package listen

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// h2TestSite is a CA, a certificate it issued for shop.example.com, and a
// loopback listener for an HTTP/2 server's tests (closed at the test's end).
func h2TestSite(t *testing.T) (*testenv.CA, tls.Certificate, net.Listener) {
	ca := testenv.NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "shop.example.com")
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ca, cert, ln
}

// A connection net/http accepted before its HTTP/2 server began shutting
// down, whose client sent the preface only after: net/http registers a
// connection for the shutdown's GOAWAY once it has read the preface, and
// the shutdown had already told the connections it knew. It gets its
// GOAWAY all the same, rather than being served on until the shutdown's
// deadline cuts it.
func TestH2ConnectionRegisteredAfterShutdownGetsAGoAway(t *testing.T) {
	ca, cert, ln := h2TestSite(t)

	cfg := testH2Config(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") })
	cfg.Addr = ln.Addr()
	h := newH2Server(cfg)
	// net/http calls ConnContext once it has accepted a connection, before
	// it reads anything from it.
	accepted := make(chan struct{}, 2)
	connContext := h.hs.ConnContext
	h.hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		accepted <- struct{}{}
		return connContext(ctx, c)
	}
	served := make(chan error, 1)
	go func() { served <- h.Serve() }()

	// connect dials a client connection that negotiates h2 and hands its
	// server side to ServeConn, as fasthttp's NextProto handler would.
	connect := func() *tls.Conn {
		go func() {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			sc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
			if sc.Handshake() == nil {
				_ = h.ServeConn(&serverTLSConn{Conn: sc, done: true})
			}
		}()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "shop.example.com", RootCAs: ca.Pool, NextProtos: []string{"h2"}})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		<-accepted
		return c
	}
	start := func(c *tls.Conn) *http2.Framer {
		_, err := io.WriteString(c, http2.ClientPreface)
		require.NoError(t, err)
		fr := http2.NewFramer(c, c)
		require.NoError(t, fr.WriteSettings())
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		require.IsType(t, &http2.SettingsFrame{}, f, "the server's preface")
		return fr
	}
	// untilGoAway reads fr's frames until a GOAWAY (nil: the connection
	// ended, or the 10 s deadline passed, without one).
	untilGoAway := func(fr *http2.Framer) *http2.GoAwayFrame {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Logf("no GOAWAY: %v", err)
				return nil
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				return g
			}
		}
	}

	first := start(connect()) // registered: its SETTINGS came from net/http's serve loop
	late := connect()         // accepted, its preface not sent yet
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- h.Shutdown(ctx) }()
	// The first connection's GOAWAY: the shutdown's pass over the
	// registered connections has reached it, under the lock that
	// registering takes, so the late one registers after that pass.
	require.NotNil(t, untilGoAway(first), "a registered connection gets the shutdown's GOAWAY")

	g := untilGoAway(start(late))
	require.NotNil(t, g, "a connection registered after the shutdown's pass was never told to go away")
	require.Equal(t, http2.ErrCodeNo, g.ErrCode)
	late.Close()
	require.NoError(t, <-shut, "the shutdown ends once its connections have gone")
	require.NoError(t, <-served)
}
