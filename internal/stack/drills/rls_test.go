//go:build stack

package drills

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeguard/edgeguard/internal/stack"
)

// Every edge of the stack serves Envoy's rate limit service on its own
// port: once a region's document is pushed with regionctl rls push, the
// service is in the region's Consul catalog as edgeguard-rls, passing its
// gRPC health check, for every PoP and edge; Prometheus scrapes it as a
// target of its own (job edgeguard-rls, up); and a ShouldRateLimit through
// each edge answers OK up to the document's limit, then OVER_LIMIT.
func TestRateLimitServiceInTheStack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	doc := filepath.Join(t.TempDir(), "stack.yaml")
	require.NoError(t, os.WriteFile(doc, []byte("domain: stack\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"), 0o600))

	var all []string // every edge's service ID prefix, for Prometheus
	for _, name := range slices.Sorted(maps.Keys(env.Out.Regions)) {
		r := env.Out.Regions[name]
		// Bringing the stack up pushed its own document, so the service
		// answered (and passed its check) before anyone ran regionctl.
		out, code, err := env.regionctl(ctx, r.Consul.HTTP, "rls", "get", "--region", name, "stack.yaml")
		require.NoError(t, err)
		require.Equal(t, 0, code, "the stack's rate limit service document is not in %s: %s", name, out)
		out, code, err = env.regionctl(ctx, r.Consul.HTTP, "rls", "push", "--region", name, "--yes", "--message", "stack test", doc)
		require.NoError(t, err)
		require.Equal(t, 0, code, out)

		cl, err := api.NewClient(&api.Config{Address: strings.TrimPrefix(r.Consul.HTTP, "http://"), TokenFile: os.DevNull})
		require.NoError(t, err)
		for _, pop := range slices.Sorted(maps.Keys(r.PoPs)) {
			_, err := waitFor(ctx, 30*time.Second, fmt.Sprintf("edgeguard-rls of %s/%s passing in Consul", name, pop), func(context.Context) error {
				return rlsPassing(cl, pop, r.PoPs[pop].Edges)
			})
			require.NoError(t, err)
		}
		for _, e := range r.Edges() {
			all = append(all, e.Name)
			rlsAnswersUpToTheLimit(ctx, t, e)
		}
	}

	// Prometheus: one edgeguard-rls target per edge, up, with its region,
	// PoP and its edge's instance, and the service's series under that job
	// only.
	_, err := waitFor(ctx, 30*time.Second, "every edgeguard-rls target up in Prometheus", func(ctx context.Context) error {
		return rlsTargetsUp(ctx, len(all))
	})
	require.NoError(t, err)
	_, err = waitFor(ctx, 30*time.Second, "the calls counted under job edgeguard-rls", func(ctx context.Context) error {
		return rlsCallsCounted(ctx, len(all))
	})
	require.NoError(t, err)
}

// rlsPassing reports whether edgeguard-rls passes its check in Consul for
// exactly the edges of pop.
func rlsPassing(cl *api.Client, pop string, edges []stack.Edge) error {
	entries, _, err := cl.Health().Service("edgeguard-rls", "", true, &api.QueryOptions{Filter: fmt.Sprintf("Service.Meta.pop == %q", pop)})
	if err != nil {
		return err
	}
	var got []string
	for _, e := range entries {
		got = append(got, fmt.Sprintf("%s:%d", e.Service.Address, e.Service.Port))
	}
	var want []string
	for _, e := range edges {
		want = append(want, e.RLS)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("passing %v, want %v", got, want)
	}
	return nil
}

// rlsAnswersUpToTheLimit calls edge e's rate limit service three times
// for a new user of the document's descriptor (2 an hour): OK, OK,
// OVER_LIMIT.
func rlsAnswersUpToTheLimit(ctx context.Context, t *testing.T, e stack.Edge) {
	conn, err := grpc.NewClient(e.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	client := pb.NewRateLimitServiceClient(conn)
	user := fmt.Sprintf("%s-%d", e.Name, time.Now().UnixNano())
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "stack", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}})
		require.NoError(t, err, e.Name)
		require.Equal(t, want, resp.OverallCode, "%s: call %d", e.Name, i+1)
	}
	require.NoError(t, conn.Close())
}

// rlsTargetsUp reports whether Prometheus has n edgeguard-rls targets up,
// each with its region and PoP and the instance of one edge.
func rlsTargetsUp(ctx context.Context, n int) error {
	res, err := promQuery(ctx, `up{job="edgeguard-rls"} == 1`)
	if err != nil {
		return err
	}
	if len(res) != n {
		return fmt.Errorf("%d targets up, want %d: %v", len(res), n, res)
	}
	edges, err := promQuery(ctx, `up{job="edgeguard-edge"}`)
	if err != nil {
		return err
	}
	instances := map[string]bool{}
	for _, s := range edges {
		instances[s.Metric["instance"]] = true
	}
	for _, s := range res {
		if s.Metric["region"] == "" || s.Metric["pop"] == "" {
			return fmt.Errorf("target without region or pop: %v", s.Metric)
		}
		if !instances[s.Metric["instance"]] {
			return fmt.Errorf("target %v is not one edge's instance (%v)", s.Metric, instances)
		}
	}
	return nil
}

// rlsCallsCounted reports whether Prometheus counts n over-limit calls
// under job edgeguard-rls, and the service's series under no other job.
func rlsCallsCounted(ctx context.Context, n int) error {
	over, err := promQuery(ctx, `sum(edgeguard_rls_requests_total{job="edgeguard-rls",code="over_limit"})`)
	if err != nil {
		return err
	}
	if len(over) != 1 || over[0].Value[1] != fmt.Sprint(n) {
		return fmt.Errorf("over_limit calls %v, want %d", over, n)
	}
	dup, err := promQuery(ctx, `edgeguard_rls_requests_total{job!="edgeguard-rls"}`)
	if err != nil {
		return err
	}
	if len(dup) != 0 {
		return fmt.Errorf("rate limit service series under another job: %v", dup)
	}
	return nil
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// promQuery runs an instant query against the stack's Prometheus.
func promQuery(ctx context.Context, q string) ([]promSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.Out.PrometheusURL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, body.Error)
	}
	return body.Data.Result, nil
}
