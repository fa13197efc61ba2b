package edge

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestRLSFromConsul: with --rls-listen and --consul and no
// --rls-config-dir, the rate limit service is UNAVAILABLE (health
// NOT_SERVING) while the region has no document, then answers from the documents
// regionctl rls push wrote to the region's rls/ prefix, with no file; a
// new push changes the answers; a push of an invalid document is refused
// by regionctl, and one written past it is refused by the edge (logged,
// counted), which keeps the configuration in force.
func TestRLSFromConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	dir := t.TempDir()
	doc := filepath.Join(dir, "edge.yaml")
	write := func(text string) {
		t.Helper()
		require.NoError(t, os.WriteFile(doc, []byte(text), 0o600))
	}
	r := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(dir, "rules.yaml"), func(cfg *Config) {
		cfg.RLS = RLSConfig{Listen: "127.0.0.1:0"}
	})
	conn, err := grpc.NewClient(r.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := pb.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ask := func(user string) (*pb.RateLimitResponse, error) {
		return client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
	}
	limitOf := func(user string) uint32 {
		resp, err := ask(user)
		if err != nil {
			// Before the first read of Consul, calls are refused as
			// UNAVAILABLE, as Envoy expects of a service not ready.
			require.Equal(t, grpccodes.Unavailable, status.Code(err), err)
			return 0
		}
		return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	// No document yet: refused (counted), and calls are UNAVAILABLE.
	require.Eventually(t, func() bool {
		return metricSum(t, r, "edgeguard_rls_config_loads_total", "outcome", "error") == 1
	}, 15*time.Second, 10*time.Millisecond)
	_, err = ask("probe")
	require.Equal(t, grpccodes.Unavailable, status.Code(err), err)
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		require.NoError(t, err)
		return h.Status
	}
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, health())
	// Its own service in the catalog, beside the edge's, with a gRPC check
	// that fails while it has no document.
	catalog, err := c.Client(c.ManagementToken)
	require.NoError(t, err)
	rlsEntry := func() *api.ServiceEntry {
		entries, _, err := catalog.Health().Service("edgeguard-rls", "", false, nil)
		require.NoError(t, err)
		if len(entries) != 1 {
			return nil
		}
		return entries[0]
	}
	require.Eventually(t, func() bool {
		e := rlsEntry()
		return e != nil && e.Checks.AggregatedStatus() == api.HealthCritical
	}, 15*time.Second, 50*time.Millisecond, "registered, critical without documents")
	entry := rlsEntry()
	require.Equal(t, map[string]string{"region": "eu-west", "pop": "ams", "edge": edgeID(t, catalog), "metrics_port": portOf(t, r.AdminAddr())}, entry.Service.Meta)
	require.Equal(t, portOf(t, r.RLSAddr()), fmt.Sprint(entry.Service.Port))

	write(rlsDoc) // user: 2 per hour
	out, code := regionctlRun(t, "--consul", c.HTTPAddr(), "rls", "push", "--region", "eu-west", "--yes", doc)
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return limitOf("probe") == 2 }, 15*time.Second, 10*time.Millisecond)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, health())
	require.Eventually(t, func() bool {
		e := rlsEntry()
		return e != nil && e.Checks.AggregatedStatus() == api.HealthPassing
	}, 15*time.Second, 50*time.Millisecond, "the agent's gRPC check passes once the service has documents")
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := ask("u1")
		require.NoError(t, err)
		require.Equal(t, want, resp.OverallCode, "call %d", i+1)
	}

	// A new push: the answers change, no reload, no file.
	write(strings.Replace(rlsDoc, "requests_per_unit: 2", "requests_per_unit: 9", 1))
	out, code = regionctlRun(t, "--consul", c.HTTPAddr(), "rls", "push", "--region", "eu-west", "--yes", "--message", "raise", doc)
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return limitOf("probe") == 9 }, 15*time.Second, 10*time.Millisecond)

	// regionctl refuses an invalid document and writes nothing.
	write("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	out, code = regionctlRun(t, "--consul", c.HTTPAddr(), "rls", "push", "--region", "eu-west", "--yes", doc)
	require.Equal(t, 4, code, out)
	require.Contains(t, out, doc+`:4: descriptor edge.user: rate_limit.unit: invalid unit "fortnight"`)

	// Written past regionctl, the edge refuses it and keeps what it runs.
	before := metricSum(t, r, "edgeguard_rls_config_loads_total", "outcome", "error")
	kv, err := c.Client(c.ManagementToken)
	require.NoError(t, err)
	_, err = kv.KV().Put(&api.KVPair{Key: rc.Layout().RLSDoc("eu-west", "edge.yaml"), Value: []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return metricSum(t, r, "edgeguard_rls_config_loads_total", "outcome", "error") == before+1
	}, 15*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 9, limitOf("probe"))

	// Restarted while Consul is unreachable, the edge serves the documents
	// it last loaded (kept beside the rules cache), not UNAVAILABLE.
	r.stop()
	require.Nil(t, rlsEntry(), "a stopped edge leaves the catalog with its rate limit service")
	require.NoError(t, c.Stop())
	again := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(dir, "rules.yaml"), func(cfg *Config) {
		cfg.RLS = RLSConfig{Listen: "127.0.0.1:0"}
	})
	conn2, err := grpc.NewClient(again.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn2.Close()
	resp, err := pb.NewRateLimitServiceClient(conn2).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "after-restart"}}}}})
	require.NoError(t, err, "the cached documents answer before Consul does")
	require.EqualValues(t, 9, resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit())
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}

// edgeID is the ID of the one edge registered in the catalog.
func edgeID(t *testing.T, c *api.Client) string {
	t.Helper()
	entries, _, err := c.Health().Service("edgeguard-edge", "", false, nil)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	return entries[0].Service.ID
}
