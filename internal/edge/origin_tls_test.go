package edge

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// startHTTPSOrigin serves "secure" over TLS on loopback with a certificate
// for origin.test from a fresh CA, whose PEM it returns.
func startHTTPSOrigin(t *testing.T) (url string, caPEM []byte) {
	t.Helper()
	ca := testenv.NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "origin.test")
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "secure") }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		_ = srv.Serve(tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}))
	}()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String(), ca.PEM
}

// An https origin is verified against --origin-ca-file under
// --origin-tls-server-name: 200 with the CA, 502 with the system's roots.
func TestOriginCAFile(t *testing.T) {
	url, caPEM := startHTTPSOrigin(t)
	caFile := filepath.Join(t.TempDir(), "origin-ca.pem")
	require.NoError(t, os.WriteFile(caFile, caPEM, 0o600))
	for _, tc := range []struct {
		name   string
		caFile string
		want   int
	}{{"with the CA", caFile, 200}, {"system roots", "", 502}} {
		t.Run(tc.name, func(t *testing.T) {
			r := startEdge(t, perIP, func(c *config.Config) {
				c.Origins = []string{url}
				c.OriginTLSServerName, c.OriginCAFile = "origin.test", tc.caFile
				c.OriginDialTimeout = 10 * time.Second // a loaded machine may take more than the default second over a handshake
			})
			resp := r.get(t, "/")
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tc.want, resp.StatusCode, "%s", body)
			if tc.want == 200 {
				require.Equal(t, "secure", string(body))
			}
		})
	}
}

func TestOriginCAFileUnusable(t *testing.T) {
	url, _ := startHTTPSOrigin(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate\n"), 0o600))
	for file, want := range map[string]string{
		filepath.Join(t.TempDir(), "missing.pem"): "origin-ca-file: open ",
		garbage: "origin-ca-file: no PEM certificate in " + garbage,
	} {
		cfg := config.DefaultConfig()
		cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Origins, cfg.OriginCAFile = []string{url}, file
		_, err := New(cfg, slog.New(slog.DiscardHandler))
		require.ErrorContains(t, err, want, "the edge refuses to start")
	}
}
