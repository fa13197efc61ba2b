package regionctl

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// fakeEdge registers an edge the way the edge does, with a TTL check in the
// given state instead of an HTTP one.
func fakeEdge(t *testing.T, dc *testenv.Consul, id, pop, version, status string) {
	t.Helper()
	c, err := dc.Client("")
	require.NoError(t, err)
	require.NoError(t, c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: id, Name: region.Service, Port: 8080,
		Meta:  map[string]string{"region": dc.Datacenter, "pop": pop, "rules_version": version},
		Check: &api.AgentServiceCheck{CheckID: id + ":ttl", TTL: "10m", Status: status},
	}))
	t.Cleanup(func() { _ = c.Agent().ServiceDeregister(id) })
}

// waitStatus polls regions status until check accepts it.
func waitStatus(t *testing.T, p string, check func(r result) bool, args ...string) result {
	t.Helper()
	var last result
	what := strings.Join(append([]string{"regions status"}, args...), " ") + " to answer as expected"
	err := proc.PollEvery(testenv.Within(t, 10*time.Second), 50*time.Millisecond, what, func(context.Context) error {
		if last = run(t, append([]string{"regions", "status", "--prefix", p}, args...)...); !check(last) {
			return fmt.Errorf("it answered %s", last)
		}
		return nil
	})
	require.NoError(t, err)
	return last
}

func TestRegionsStatus(t *testing.T) {
	// Not parallel with other status tests: edges are not namespaced.
	p := prefix(t)
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--all", file(t, rulesV1)).code)
	want := version(t, rulesV1)

	// No edges yet: trivially converged.
	r := run(t, "regions", "status", "--prefix", p)
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "eu-west: expected rules version "+want+"; no edges registered")

	fakeEdge(t, euWest, "edge-ams-1", "ams", want, api.HealthPassing)
	fakeEdge(t, euWest, "edge-fra-1", "fra", "0123456789ab", api.HealthPassing)
	fakeEdge(t, euWest, "edge-fra-2", "fra", "0123456789ab", api.HealthCritical)
	fakeEdge(t, usEast, "edge-iad-1", "iad", want, api.HealthPassing)

	r = waitStatus(t, p, func(r result) bool {
		return strings.Contains(r.stdout, "2 edges healthy of 3 edges") && strings.Contains(r.stdout, "us-east: expected rules version "+want+"; 1 edge healthy of 1 edge")
	})
	require.Equal(t, ExitNotConverged, r.code, r)
	require.Regexp(t, `eu-west: expected rules version `+want+`; 2 edges healthy of 3 edges, 1 NOT CONVERGED`, r.stdout)
	require.Contains(t, r.stdout, "  pop ams: 1 healthy of 1\n")
	require.Contains(t, r.stdout, "  pop fra: 1 healthy of 2\n")
	require.Regexp(t, `edge-ams-1\s+127.0.0.1:8080\s+healthy\s+version 0\.1\.0 or older\s+rules `+want+`\s+converged`, r.stdout)
	require.Regexp(t, `edge-fra-1\s+127.0.0.1:8080\s+healthy\s+version 0\.1\.0 or older\s+rules 0123456789ab\s+NOT CONVERGED`, r.stdout)
	require.Regexp(t, `edge-fra-2\s+127.0.0.1:8080\s+UNHEALTHY\s+version 0\.1\.0 or older\s+rules 0123456789ab\s+unhealthy, not converged`, r.stdout)
	require.Contains(t, r.stderr, "regionctl: NOT CONVERGED: eu-west (1 edge)")

	// One region only: us-east is converged.
	r = run(t, "regions", "status", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "all regions converged")

	r = run(t, "regions", "status", "--prefix", p, "--output", "json")
	require.Equal(t, ExitNotConverged, r.code, r)
	m := decodeJSON(t, r.stdout)
	require.Equal(t, false, m["converged"])
	regions := m["regions"].([]any)
	require.Len(t, regions, 2)
	eu := regions[0].(map[string]any)
	require.Equal(t, "eu-west", eu["region"])
	require.Equal(t, want, eu["expected_version"])
	require.Equal(t, float64(1), eu["not_converged"])

	// The lagging edge catches up (the edge re-registers with new meta);
	// the unhealthy one does not count.
	fakeEdge(t, euWest, "edge-fra-1", "fra", want, api.HealthPassing)
	r = waitStatus(t, p, func(r result) bool { return r.code == ExitOK })
	require.Contains(t, r.stdout, "eu-west: expected rules version "+want+"; 2 edges healthy of 3 edges, converged")
	require.Contains(t, r.stdout, "all regions converged")

	// A new push: every edge is behind until it reports the new version.
	require.Equal(t, ExitOK, run(t, "rules", "push", "--prefix", p, "--region", "us-east", file(t, rulesV3)).code)
	r = run(t, "regions", "status", "--prefix", p, "--region", "us-east")
	require.Equal(t, ExitNotConverged, r.code, r)
	now := effective(t, p, "us-east")
	require.NotEqual(t, want, now)
	require.Contains(t, r.stdout, "us-east: expected rules version "+now+"; 1 edge healthy of 1 edge, 1 NOT CONVERGED")
}
