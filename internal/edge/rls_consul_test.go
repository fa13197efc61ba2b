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

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
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
	f := newRLSFixture(t, c)

	t.Run("no document: unavailable, registered critical", func(t *testing.T) {
		// Refused (counted), and calls are UNAVAILABLE.
		require.Eventually(t, func() bool {
			return metricSum(t, f.r, "edgeguard_rls_config_loads_total", "outcome", "error") == 1
		}, 15*time.Second, 10*time.Millisecond)
		_, err := f.ask("probe")
		require.Equal(t, grpccodes.Unavailable, status.Code(err), err)
		require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, f.health(t))
		// Its own service in the catalog, beside the edge's, with a gRPC
		// check that fails while it has no document.
		require.Eventually(t, func() bool {
			e := f.rlsEntry(t)
			return e != nil && e.Checks.AggregatedStatus() == api.HealthCritical
		}, 15*time.Second, 50*time.Millisecond, "registered, critical without documents")
		entry := f.rlsEntry(t)
		require.Equal(t, map[string]string{"region": "eu-west", "pop": "ams", "edge": edgeID(t, f.catalog), "metrics_port": portOf(t, f.r.AdminAddr())}, entry.Service.Meta)
		require.Equal(t, portOf(t, f.r.RLSAddr()), fmt.Sprint(entry.Service.Port))
	})

	t.Run("a push is served, healthy", func(t *testing.T) {
		out, code := f.push(t, rlsDoc) // user: 2 per hour
		require.Equal(t, 0, code, out)
		require.Eventually(t, func() bool { return f.limitOf(t, "probe") == 2 }, 15*time.Second, 10*time.Millisecond)
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, f.health(t))
		require.Eventually(t, func() bool {
			e := f.rlsEntry(t)
			return e != nil && e.Checks.AggregatedStatus() == api.HealthPassing
		}, 15*time.Second, 50*time.Millisecond, "the agent's gRPC check passes once the service has documents")
		for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
			resp, err := f.ask("u1")
			require.NoError(t, err)
			require.Equal(t, want, resp.OverallCode, "call %d", i+1)
		}
	})

	t.Run("a new push changes the answers, no reload, no file", func(t *testing.T) {
		out, code := f.push(t, strings.Replace(rlsDoc, "requests_per_unit: 2", "requests_per_unit: 9", 1), "--message", "raise")
		require.Equal(t, 0, code, out)
		require.Eventually(t, func() bool { return f.limitOf(t, "probe") == 9 }, 15*time.Second, 10*time.Millisecond)
	})

	t.Run("regionctl refuses an invalid document and writes nothing", func(t *testing.T) {
		out, code := f.push(t, "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
		require.Equal(t, 4, code, out)
		require.Contains(t, out, f.doc+`:4: descriptor edge.user: rate_limit.unit: invalid unit "fortnight"`)
	})

	t.Run("written past regionctl, the edge refuses it and keeps what it runs", func(t *testing.T) {
		before := metricSum(t, f.r, "edgeguard_rls_config_loads_total", "outcome", "error")
		_, err := f.catalog.KV().Put(&api.KVPair{Key: f.rc.Layout().RLSDoc("eu-west", "edge.yaml"), Value: []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")}, nil)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return metricSum(t, f.r, "edgeguard_rls_config_loads_total", "outcome", "error") == before+1
		}, 15*time.Second, 10*time.Millisecond)
		require.EqualValues(t, 9, f.limitOf(t, "probe"))
	})

	t.Run("restarted while Consul is unreachable, it serves the documents it last loaded", func(t *testing.T) {
		// Kept beside the rules cache; not UNAVAILABLE.
		f.r.stop()
		require.Nil(t, f.rlsEntry(t), "a stopped edge leaves the catalog with its rate limit service")
		require.NoError(t, c.Stop())
		again := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), f.rulesCache, func(cfg *config.Config) {
			cfg.RLS = config.RLSConfig{Listen: "127.0.0.1:0"}
		})
		conn, err := grpc.NewClient(again.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(f.ctx, &pb.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "after-restart"}}}}})
		require.NoError(t, err, "the cached documents answer before Consul does")
		require.EqualValues(t, 9, resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit())
	})
}

// rlsFixture is an edge serving the rate limit service from a region's
// Consul, a gRPC client of it, and the region's catalog.
type rlsFixture struct {
	c          *testenv.Consul
	rc         *region.Client
	r          *running
	doc        string // the file regionctl pushes
	rulesCache string
	conn       *grpc.ClientConn
	client     pb.RateLimitServiceClient
	catalog    *api.Client
	ctx        context.Context
}

func newRLSFixture(t *testing.T, c *testenv.Consul) *rlsFixture {
	t.Helper()
	dir := t.TempDir()
	f := &rlsFixture{c: c, rc: regionClient(t, c), doc: filepath.Join(dir, "edge.yaml"), rulesCache: filepath.Join(dir, "rules.yaml")}
	f.r = startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), f.rulesCache, func(cfg *config.Config) {
		cfg.RLS = config.RLSConfig{Listen: "127.0.0.1:0"}
	})
	conn, err := grpc.NewClient(f.r.RLSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	f.conn, f.client = conn, pb.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	f.ctx = ctx
	f.catalog, err = c.Client(c.ManagementToken)
	require.NoError(t, err)
	return f
}

// ask asks for one descriptor, user=user, of the domain edge.
func (f *rlsFixture) ask(user string) (*pb.RateLimitResponse, error) {
	return f.client.ShouldRateLimit(f.ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
}

// limitOf is the limit the service answers for user, 0 before it has read
// Consul.
func (f *rlsFixture) limitOf(t *testing.T, user string) uint32 {
	resp, err := f.ask(user)
	if err != nil {
		// Before the first read of Consul, calls are refused as
		// UNAVAILABLE, as Envoy expects of a service not ready.
		require.Equal(t, grpccodes.Unavailable, status.Code(err), err)
		return 0
	}
	return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

func (f *rlsFixture) health(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	h, err := healthpb.NewHealthClient(f.conn).Check(f.ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	require.NoError(t, err)
	return h.Status
}

// rlsEntry is the rate limit service's catalog entry, nil unless there is
// exactly one.
func (f *rlsFixture) rlsEntry(t *testing.T) *api.ServiceEntry {
	entries, _, err := f.catalog.Health().Service("edgeguard-rls", "", false, nil)
	require.NoError(t, err)
	if len(entries) != 1 {
		return nil
	}
	return entries[0]
}

// push writes text to the document and runs regionctl rls push on it.
func (f *rlsFixture) push(t *testing.T, text string, flags ...string) (string, int) {
	t.Helper()
	require.NoError(t, os.WriteFile(f.doc, []byte(text), 0o600))
	args := append([]string{"--consul", f.c.HTTPAddr(), "rls", "push", "--region", "eu-west", "--yes"}, flags...)
	return regionctlRun(t, append(args, f.doc)...)
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
