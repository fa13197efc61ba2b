package rlslink_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

const (
	rlsDoc = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"
	// rlsBad has a unit no limit has.
	rlsBad  = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n"
	rlsNine = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 9}\n"
	service = "envoy.service.ratelimit.v3.RateLimitService"
)

// newLimiter is a limiter over store, closed when the test ends.
func newLimiter(t *testing.T, store limiter.Store) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(store, limiter.Config{StoreName: "test", Timeout: time.Second}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return l
}

// serve builds the service of c over lim and serves it until the test
// ends.
func serve(t *testing.T, c config.RLSConfig, lim *limiter.Limiter) *rlslink.Service {
	t.Helper()
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	s, err := rlslink.New(c, rlslink.Options{
		Limiter: lim, Nodes: func() int { return 1 }, KeySalt: testenv.KeyPrefix(t),
		IPv6Prefix: 64, Region: "eu-west", Log: slog.New(slog.DiscardHandler),
	}, prometheus.NewRegistry())
	require.NoError(t, err)
	require.NotNil(t, s)
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Stop(ctx)
		require.NoError(t, <-done)
		s.Close()
	})
	return s
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func configDir(t *testing.T, doc string) string {
	t.Helper()
	dir := t.TempDir()
	writeDoc(t, dir, doc)
	return dir
}

func writeDoc(t *testing.T, dir, doc string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(doc), 0o600))
}

func ctx(t *testing.T) context.Context { return testenv.Within(t, 10*time.Second) }

// ask asks for one request of user value.
func ask(t *testing.T, conn *grpc.ClientConn, value string) (*pb.RateLimitResponse, error) {
	t.Helper()
	return pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx(t), &pb.RateLimitRequest{
		Domain:      "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}}}},
	})
}

func health(t *testing.T, conn *grpc.ClientConn, name string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	h, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{Service: name})
	require.NoError(t, err)
	return h.Status
}

// A descriptor is limited over real gRPC from a configuration directory,
// against the memory store and against Redis: two per hour, the third is
// over the limit, another value has its own count.
func TestServesADescriptorFromTheConfigDirectory(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) limiter.Store
	}{
		{"memory", func(*testing.T) limiter.Store { return limiter.NewMemoryStore() }},
		{"redis", func(t *testing.T) limiter.Store {
			c, err := limiter.NewRedisClient(rd.URL(), limiter.ModeStandalone)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			st, err := limiter.NewRedisStore(limiter.Conn(c), testenv.KeyPrefix(t))
			require.NoError(t, err)
			return st
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := serve(t, config.RLSConfig{ConfigDir: configDir(t, rlsDoc)}, newLimiter(t, tc.store(t)))
			require.False(t, s.FromConsul())
			require.True(t, s.Configured())
			require.Equal(t, 1, s.Domains())
			conn := dial(t, s.Addr())
			require.Equal(t, healthpb.HealthCheckResponse_SERVING, health(t, conn, service))
			var codes []pb.RateLimitResponse_Code
			for range 3 {
				resp, err := ask(t, conn, "u1")
				require.NoError(t, err)
				codes = append(codes, resp.OverallCode)
			}
			require.Equal(t, []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT}, codes)
			resp, err := ask(t, conn, "u2")
			require.NoError(t, err)
			require.Equal(t, pb.RateLimitResponse_OK, resp.OverallCode, "each value counts on its own")
			require.EqualValues(t, 2, resp.Statuses[0].CurrentLimit.RequestsPerUnit)
		})
	}
}

// Reload re-reads the directory: an invalid set is refused and the
// configuration in force stays; a valid one replaces it. A directory
// invalid at start refuses to start, and no --rls-listen is no service.
func TestReloadKeepsTheConfigurationInForceWhenInvalid(t *testing.T) {
	dir := configDir(t, rlsDoc)
	s := serve(t, config.RLSConfig{ConfigDir: dir}, newLimiter(t, limiter.NewMemoryStore()))
	conn := dial(t, s.Addr())
	limitNow := func() uint32 {
		resp, err := ask(t, conn, "probe")
		require.NoError(t, err)
		return resp.Statuses[0].CurrentLimit.RequestsPerUnit
	}
	require.EqualValues(t, 2, limitNow())

	writeDoc(t, dir, rlsBad)
	s.Reload()
	require.EqualValues(t, 2, limitNow(), "the configuration in force stays")

	writeDoc(t, dir, rlsNine)
	s.Reload()
	require.EqualValues(t, 9, limitNow())

	bad := configDir(t, rlsBad)
	_, err := rlslink.New(config.RLSConfig{Listen: "127.0.0.1:0", ConfigDir: bad}, rlslink.Options{
		Limiter: newLimiter(t, limiter.NewMemoryStore()), Nodes: func() int { return 1 }, Log: slog.New(slog.DiscardHandler),
	}, prometheus.NewRegistry())
	require.ErrorContains(t, err, "loading the rate limit service configuration")

	off, err := rlslink.New(config.RLSConfig{ConfigDir: dir}, rlslink.Options{Log: slog.New(slog.DiscardHandler)}, prometheus.NewRegistry())
	require.NoError(t, err)
	require.Nil(t, off)
	// Off, the service answers as absent: no address, no documents from
	// Consul, nothing to reload.
	require.Empty(t, off.Addr())
	require.False(t, off.FromConsul())
	off.Reload()
	require.False(t, s.FromConsul(), "a directory wins over Consul")
}

// SetServing flips the gRPC health of the service and of the server ("")
// alike.
func TestSetServingFlipsTheHealthStatus(t *testing.T) {
	s := serve(t, config.RLSConfig{ConfigDir: configDir(t, rlsDoc)}, newLimiter(t, limiter.NewMemoryStore()))
	conn := dial(t, s.Addr())
	for _, tc := range []struct {
		serving bool
		want    healthpb.HealthCheckResponse_ServingStatus
	}{
		{false, healthpb.HealthCheckResponse_NOT_SERVING},
		{true, healthpb.HealthCheckResponse_SERVING},
		{false, healthpb.HealthCheckResponse_NOT_SERVING},
	} {
		s.SetServing(tc.serving)
		for _, name := range []string{"", service} {
			require.Equal(t, tc.want, health(t, conn, name), "SetServing(%t), service %q", tc.serving, name)
		}
	}
}

// With no directory the documents come from Consul, handed in by key:
// until the first set loads, calls are UNAVAILABLE and the health is
// NOT_SERVING; an invalid set is refused and changes nothing; a valid
// one is served (Redis behind the limiter).
func TestDocumentsHandedInFromConsul(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	c, err := limiter.NewRedisClient(rd.URL(), limiter.ModeStandalone)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	st, err := limiter.NewRedisStore(limiter.Conn(c), testenv.KeyPrefix(t))
	require.NoError(t, err)

	s := serve(t, config.RLSConfig{}, newLimiter(t, st))
	require.True(t, s.FromConsul())
	require.False(t, s.Configured())
	conn := dial(t, s.Addr())
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, health(t, conn, service))
	_, err = ask(t, conn, "u1")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	require.Error(t, s.LoadDocuments(map[string][]byte{"rls/eu-west/edge": []byte(rlsBad)}))
	require.False(t, s.Configured(), "an invalid set is refused")
	s.Reload() // documents from Consul: nothing to re-read
	require.False(t, s.Configured())

	require.NoError(t, s.LoadDocuments(map[string][]byte{"rls/eu-west/edge": []byte(rlsDoc)}))
	require.True(t, s.Configured())
	require.Equal(t, 1, s.Domains())
	s.SetServing(true)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, health(t, conn, service))
	for _, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := ask(t, conn, "u1")
		require.NoError(t, err)
		require.Equal(t, want, resp.OverallCode)
	}
}

// MaxConnsPerIP caps the connections one address holds on the listener:
// one more is closed at accept, without a word.
func TestConnectionsPerAddressAreCapped(t *testing.T) {
	s := serve(t, config.RLSConfig{ConfigDir: configDir(t, rlsDoc), MaxConnsPerIP: 1}, newLimiter(t, limiter.NewMemoryStore()))
	held, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer held.Close()
	_, err = held.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	require.NoError(t, held.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadFull(held, make([]byte, 9))
	require.NoError(t, err, "the first is served: the server's SETTINGS arrive")

	second, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer second.Close()
	require.NoError(t, second.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := second.Read(make([]byte, 9))
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF, "closed at accept")
}

// --rls-strict-match reaches the service: by default an entry whose key
// and value join to a descriptor's key_value gets its limit, as in the
// reference; with StrictMatch it does not, from a directory and from
// documents handed in alike.
func TestStrictMatchReachesTheService(t *testing.T) {
	doc := "domain: edge\ndescriptors:\n  - key: user\n    value: a_b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	split := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_a", Value: "b"}}}}}
	limited := func(s *rlslink.Service) bool {
		resp, err := pb.NewRateLimitServiceClient(dial(t, s.Addr())).ShouldRateLimit(ctx(t), split)
		require.NoError(t, err)
		return resp.Statuses[0].CurrentLimit != nil
	}
	for _, strict := range []bool{false, true} {
		c := config.RLSConfig{ConfigDir: configDir(t, doc), StrictMatch: strict}
		s := serve(t, c, newLimiter(t, limiter.NewMemoryStore()))
		require.Equal(t, !strict, limited(s), "strict %v, from a directory", strict)
		require.NoError(t, s.LoadDocuments(map[string][]byte{"rls/eu-west/edge": []byte(doc)}))
		require.Equal(t, !strict, limited(s), "strict %v, documents handed in", strict)
		s.Reload()
		require.Equal(t, !strict, limited(s), "strict %v, reloaded", strict)
	}
}
