package rlsd_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// GRPC_SERVER_USE_TLS with the reference's certificate variables: the
// gRPC port speaks TLS only.
func TestGRPCServerTLS(t *testing.T) {
	ca := testenv.NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "rls.example.com")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(key, leaf.KeyPEM, 0o600))
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr(t), "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + cert, "GRPC_SERVER_TLS_KEY=" + key,
	})
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, ServerName: "rls.example.com"})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	plain := p.conn
	p.conn = conn
	r := p.call(t, "rl", "user", unique(t))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, uint32(2), r.Statuses[0].LimitRemaining)

	_, err = pb.NewRateLimitServiceClient(plain).ShouldRateLimit(t.Context(), &pb.RateLimitRequest{Domain: "rl"})
	require.Error(t, err, "plaintext answered on the TLS port")
	p.stop(t)
}
