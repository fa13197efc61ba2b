package edge

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
)

// A connection that has sent nothing holds a shutdown for listen.QuietGrace
// from its accept, not until --read-timeout: fasthttp counts a connection
// as busy from its accept, and without the edge's own count its shutdown
// waited for such a connection (a browser's preconnect, a connection a
// client's pool dialled and never used) until the read timeout ended it.
// One that speaks within the grace, after the listener has closed, is
// still answered. Read timeout and shutdown timeout are set far above the
// grace, so that the drain's end tells them apart.
func TestShutdownClosesQuietConnections(t *testing.T) {
	waiting(t)
	const readTimeout = time.Minute
	r := startEdge(t, perIP, func(c *config.Config) {
		c.ReadTimeout, c.ShutdownTimeout = readTimeout, 2*readTimeout
	})
	dial := func() (net.Conn, time.Time) {
		at := time.Now() // the edge accepts it at this instant or later
		c, err := net.Dial("tcp", r.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c, at
	}
	silent, silentAt := dial()
	late, _ := dial()
	// A kept-alive connection that has served a request is idle: fasthttp
	// closes it at once, as before.
	served, _ := dial()
	_, err := io.WriteString(served, "GET / HTTP/1.1\r\nHost: quiet.test\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(served), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	stopped := make(chan time.Time, 1)
	go func() { r.stop(); stopped <- time.Now() }()
	// The late one speaks once the drain has begun (the listener is closed:
	// a new connection is refused) and within its grace.
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", r.Addr())
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the listener closes")
	_, err = io.WriteString(late, "GET / HTTP/1.1\r\nHost: quiet.test\r\n\r\n")
	require.NoError(t, err)
	resp, err = http.ReadResponse(bufio.NewReader(late), nil)
	require.NoError(t, err, "a connection that speaks within its grace is answered")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The silent one is closed by the edge once its grace has passed.
	require.NoError(t, silent.SetReadDeadline(time.Now().Add(readTimeout)))
	_, err = silent.Read(make([]byte, 1))
	closedAt := time.Now()
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the read timeout, not the edge, ended it: %v", err)
	require.GreaterOrEqual(t, closedAt.Sub(silentAt), listen.QuietGrace, "closed before its grace")
	end := <-stopped
	require.NoError(t, r.stopErr, "the drain ended within the shutdown timeout")
	require.Less(t, end.Sub(silentAt), readTimeout, "the drain waited for the read timeout")
	t.Logf("silent connection closed %v after it was dialled; the edge stopped %v after", closedAt.Sub(silentAt).Round(time.Millisecond), end.Sub(silentAt).Round(time.Millisecond))
}

// The same on the TLS listener: a connection that never sent its
// ClientHello and one whose handshake is done but which sent no request
// are each closed by the edge once their grace has passed.
func TestShutdownClosesQuietTLSConnections(t *testing.T) {
	waiting(t)
	const readTimeout = time.Minute
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, func(c *config.Config) {
		c.ReadTimeout, c.ShutdownTimeout = readTimeout, 2*readTimeout
	})
	dialled := time.Now() // both are accepted at this instant or later
	noHello, err := net.Dial("tcp", r.TLSAddr())
	require.NoError(t, err)
	defer noHello.Close()
	noRequest, err := site.dialTLS(r, "shop.example.com", nil)
	require.NoError(t, err)
	defer noRequest.Close()

	stopped := make(chan time.Time, 1)
	go func() { r.stop(); stopped <- time.Now() }()
	for name, c := range map[string]net.Conn{"no ClientHello": noHello, "no request": noRequest} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(readTimeout)))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err, name)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "%s: the read timeout, not the edge, ended it: %v", name, err)
		require.GreaterOrEqual(t, time.Since(dialled), listen.QuietGrace, "%s: closed before its grace", name)
	}
	end := <-stopped
	require.NoError(t, r.stopErr, "the drain ended within the shutdown timeout")
	require.Less(t, end.Sub(dialled), readTimeout, "the drain waited for the read timeout")
}
