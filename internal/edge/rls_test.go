package edge

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

const rlsDoc = `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// TestRLSListener: --rls-listen serves Envoy's rate limit service over TLS
// from the edge's limiter, with health and reflection; SIGHUP's reload
// keeps the configuration in force when the new one is invalid; a client
// without a certificate is refused when --rls-client-ca asks for one, a
// client with one its CA signed is served.
func TestRLSListener(t *testing.T) {
	ca := testenv.NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "localhost")
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem"), filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(certFile, leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile, leaf.KeyPEM, 0o600))
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o600))
	confDir := filepath.Join(dir, "config")
	require.NoError(t, os.MkdirAll(confDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "edge.yaml"), []byte(rlsDoc), 0o600))

	r := startEdge(t, perIP, func(c *config.Config) {
		c.RLS.Listen, c.RLS.ConfigDir, c.RLS.TLSCert, c.RLS.TLSKey, c.RLS.Reflection = "127.0.0.1:0", confDir, certFile, keyFile, true
	})
	conn, err := grpc.NewClient(r.RLSAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, h.Status)

	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	lr, err := refl.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range lr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	require.Contains(t, names, "envoy.service.ratelimit.v3.RateLimitService")
	require.NoError(t, refl.CloseSend())

	client := pb.NewRateLimitServiceClient(conn)
	ask := func() *pb.RateLimitResponse {
		resp, err := client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}}})
		require.NoError(t, err)
		return resp
	}
	require.Equal(t, pb.RateLimitResponse_OK, ask().OverallCode)
	require.Equal(t, pb.RateLimitResponse_OK, ask().OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, ask().OverallCode)

	// An invalid document is refused on reload; the one in force stays.
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n"), 0o600))
	r.reloadFiles()
	require.EqualValues(t, 2, ask().Statuses[0].CurrentLimit.RequestsPerUnit)
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 9}\n"), 0o600))
	r.reloadFiles()
	require.EqualValues(t, 9, ask().Statuses[0].CurrentLimit.RequestsPerUnit)

	metrics := scrape(t, r)
	require.Contains(t, metrics, `edgeguard_rls_requests_total{code="over_limit"} 2`)
	require.Contains(t, metrics, `edgeguard_rls_config_loads_total{outcome="error"} 1`)

	// Mutual TLS: without a client certificate, no call gets through.
	m := startEdge(t, perIP, func(c *config.Config) {
		c.RLS.Listen, c.RLS.ConfigDir, c.RLS.TLSCert, c.RLS.TLSKey, c.RLS.ClientCA = "127.0.0.1:0", confDir, certFile, keyFile, caFile
	})
	mconn, err := grpc.NewClient(m.RLSAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})))
	require.NoError(t, err)
	defer mconn.Close()
	one := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}}}
	_, err = pb.NewRateLimitServiceClient(mconn).ShouldRateLimit(ctx, one)
	require.Error(t, err)
	// With one its CA signed, calls get through.
	cl := ca.IssueClient(t, "envoy")
	pair, err := tls.X509KeyPair(cl.CertPEM, cl.KeyPEM)
	require.NoError(t, err)
	cconn, err := grpc.NewClient(m.RLSAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, ServerName: "localhost", Certificates: []tls.Certificate{pair}})))
	require.NoError(t, err)
	defer cconn.Close()
	resp, err := pb.NewRateLimitServiceClient(cconn).ShouldRateLimit(ctx, one)
	require.NoError(t, err)
	require.Equal(t, pb.RateLimitResponse_OK, resp.OverallCode)
}

func TestRLSConfigValidation(t *testing.T) {
	c := config.DefaultConfig()
	c.DemoOrigin = true
	c.RLS = config.RLSConfig{Listen: ":8081", Headers: "fancy", HeaderNames: "raw", TLSCert: "c.pem", ClientCA: "ca.pem", MaxStreams: -1, MaxConnsPerIP: -1}
	err := c.Validate()
	require.ErrorContains(t, err, "rls-config-dir: required with --rls-listen (or --consul")
	require.ErrorContains(t, err, "rls-headers: want off, draft or legacy")
	require.ErrorContains(t, err, "rls-header-names: want hashed or path")
	require.ErrorContains(t, err, "rls-max-concurrent-streams: -1: want 1 to 4294967295 (0: 100)")
	require.ErrorContains(t, err, "rls-max-conns-per-ip: -1: want 0 (no cap) or more")
	require.ErrorContains(t, err, "rls-tls-cert and rls-tls-key: both or neither")
}

// TestCheckRLSConfigDir: edge check reports every problem of the rate
// limit service's documents, by file, line, descriptor and field.
func TestCheckRLSConfigDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rlsDoc), 0o600))
	var out, errOut strings.Builder
	args := []string{"--demo-origin", "--rls-listen", "127.0.0.1:0", "--rls-config-dir", dir}
	require.Equal(t, 0, check.Run(args, nil, &out, &errOut), out.String()+errOut.String())
	c, err := rlsconfig.LoadDir(dir, false)
	require.NoError(t, err)
	require.Contains(t, out.String(), fmt.Sprintf("rls %s (domains 1, limits %d)", dir, len(c.Limits())), "edge check says it checked the documents")
	bad := filepath.Join(dir, "b.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hours, requests_per_unit: 1}\n"), 0o600))
	out.Reset()
	require.Equal(t, 1, check.Run(args, nil, &out, &errOut))
	require.Contains(t, out.String(), bad+`:4: descriptor other.k: rate_limit.unit: invalid unit "hours"`)
}

// TestRLSDefaults: an edge started with only --rls-listen and
// --rls-config-dir answers with no header field for the client (a unique
// value it was sent appears nowhere in the answer's fields) and serves no
// reflection; --rls-headers draft names the limit by a hash, never its
// descriptor path or value.
func TestRLSDefaults(t *testing.T) {
	confDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "edge.yaml"), []byte(rlsDoc), 0o600))
	args := []string{"--demo-origin", "--rls-listen", "127.0.0.1:0", "--rls-config-dir", confDir}
	cfg, err := config.ParseArgs(args, nil, io.Discard)
	require.NoError(t, err)
	ask := func(t *testing.T, addr, value string) *pb.RateLimitResponse {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}}}}})
		require.NoError(t, err)
		require.Equal(t, pb.RateLimitResponse_OK, resp.OverallCode)
		return resp
	}
	value := fmt.Sprintf("user-%d-%d", time.Now().UnixNano(), os.Getpid())
	r := startEdge(t, perIP, func(c *config.Config) { c.RLS = cfg.RLS })
	resp := ask(t, r.RLSAddr(), value)
	require.Empty(t, resp.ResponseHeadersToAdd, "no field for the client by default")
	require.Empty(t, resp.RequestHeadersToAdd)

	conn, err := grpc.NewClient(r.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	// A server without the service may end the stream before the request
	// is sent: Send then says io.EOF, and Recv has the status.
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		require.ErrorIs(t, err, io.EOF)
	}
	_, err = refl.Recv()
	require.Equal(t, grpccodes.Unimplemented, status.Code(err), "no reflection by default")

	d := startEdge(t, perIP, func(c *config.Config) { c.RLS = cfg.RLS; c.RLS.Headers = "draft" })
	resp = ask(t, d.RLSAddr(), value)
	require.Len(t, resp.ResponseHeadersToAdd, 2)
	for _, h := range resp.ResponseHeadersToAdd {
		require.NotContains(t, h.Key+h.Value, value)
		require.NotContains(t, h.Key+h.Value, "edge.user")
		require.Regexp(t, `^"rl-[0-9a-f]{12}";`, h.Value)
	}
}

// TestRLSConnsPerAddress: the rate limit service's listener caps the
// connections one address holds (--rls-max-conns-per-ip): one more is
// closed at accept and counted; once one goes, a call gets through.
func TestRLSConnsPerAddress(t *testing.T) {
	confDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(confDir, "edge.yaml"), []byte(rlsDoc), 0o600))
	r := startEdge(t, perIP, func(c *config.Config) {
		c.RLS.Listen, c.RLS.ConfigDir, c.RLS.MaxConnsPerIP = "127.0.0.1:0", confDir, 2
	})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", r.RLSAddr())
		require.NoError(t, err)
		held = append(held, c)
		_, err = c.Write([]byte(http2.ClientPreface))
		require.NoError(t, err)
	}
	// Both are served: the server's SETTINGS arrive (a frame header).
	for _, c := range held {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := io.ReadFull(c, make([]byte, 9))
		require.NoError(t, err)
	}
	third, err := net.Dial("tcp", r.RLSAddr())
	require.NoError(t, err)
	defer third.Close()
	require.NoError(t, third.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := third.Read(make([]byte, 9))
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF, "closed at accept")
	require.Contains(t, scrape(t, r), "edgeguard_rls_connections_refused_total 1")

	require.NoError(t, held[0].Close())
	conn, err := grpc.NewClient(r.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The slot is given back when the server sees the close: a call may
	// be refused until then, never for long.
	require.Eventually(t, func() bool {
		_, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}}})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	_ = held[1].Close()
}
