package admin

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The admin server serves the handler on the listener it was given, and
// its Serve returns nil once shut down (an error only when it fails).
func TestServerServesUntilShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := newServer(Config{Registry: prometheus.NewRegistry(), Clients: http.NotFound}, ln)
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()

	resp, err := http.Get("http://" + s.Ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "ok\n", string(body))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx))
	select {
	case err := <-served:
		require.NoError(t, err, "a shut down server is no failure")
	case <-ctx.Done():
		t.Fatal("Serve did not return after Shutdown")
	}
	_, err = net.Dial("tcp", s.Ln.Addr().String())
	require.Error(t, err, "the listener is closed")
}

// A listener that fails is the server's failure.
func TestServerFailureIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	require.Error(t, newServer(Config{Registry: prometheus.NewRegistry(), Clients: http.NotFound}, ln).Serve())
}
