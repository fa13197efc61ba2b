package edge

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// catalogWait bounds the wait for edges to show healthy in the catalog.
// The agent probes each edge's /readyz every 2 s and puts a change of the
// check's status in the catalog by anti-entropy. In Consul's code
// (agent/ae), a change whose sync fails stays out of the catalog until
// another change or the agent's next full sync, one to two minutes later
// (its ae_interval of 1 m, which a user cannot set, plus a stagger of up
// to as long). That is likely what was seen once in CI and once in 168
// canary setups under the busy recipe: after 20 s an edge answered
// /readyz 200 in 2 ms and the agent's own check said passing, and the
// catalog still did not.
const catalogWait = 150 * time.Second

// waitHealthyInCatalog waits until want holds for the region's edges in the
// catalog, and fails with what the agent and the edges say when it does
// not (catalogDiagnosis). It logs that diagnosis when the wait took more
// than 20 s.
func waitHealthyInCatalog(t *testing.T, c *testenv.Consul, rc *region.Client, regionName, what string, want func([]region.Edge) error, edges ...*running) {
	t.Helper()
	start := time.Now()
	err := proc.PollEvery(testenv.Within(t, catalogWait), 100*time.Millisecond, what, func(ctx context.Context) error {
		es, _, err := rc.Edges(ctx, regionName, 0, 0)
		if err != nil {
			return err
		}
		return want(es)
	})
	require.NoError(t, err, "%s", catalogDiagnosis(c, edges...))
	if took := time.Since(start); took > 20*time.Second {
		t.Logf("%s took %s:\n%s", what, took.Round(time.Millisecond), catalogDiagnosis(c, edges...))
	}
}

// healthy counts the edges healthy in the catalog for which also holds
// (nil: every one), and says so unless they are n.
func healthy(n int, also func(region.Edge) bool) func([]region.Edge) error {
	return func(es []region.Edge) error {
		ok := 0
		for _, e := range es {
			if e.Healthy && (also == nil || also(e)) {
				ok++
			}
		}
		if ok != n {
			return fmt.Errorf("%d of %v", ok, es)
		}
		return nil
	}
}

// catalogDiagnosis says why edges are not healthy in the catalog: each
// of the agent's checks with its status and output (what the agent's
// last probe got), the agent's last log lines, and what each edge's
// /readyz answers now, and how fast.
func catalogDiagnosis(c *testenv.Consul, edges ...*running) string {
	var b strings.Builder
	var checks map[string]*api.AgentCheck
	client, err := c.Client("")
	if err == nil {
		checks, err = client.Agent().Checks()
	}
	if err != nil {
		fmt.Fprintf(&b, "agent checks: %v\n", err)
	}
	for id, chk := range checks {
		fmt.Fprintf(&b, "check %s: %s: %q\n", id, chk.Status, chk.Output)
	}
	fmt.Fprintf(&b, "--- the agent's log, last lines ---\n%s\n", c.LogTail())
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, e := range edges {
		start := time.Now()
		resp, err := hc.Get("http://" + e.AdminAddr() + "/readyz")
		if err != nil {
			fmt.Fprintf(&b, "edge %s/%s /readyz: %v after %s\n", e.cfg.Region, e.cfg.PoP, err, time.Since(start))
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Fprintf(&b, "edge %s/%s /readyz: %d %q after %s\n", e.cfg.Region, e.cfg.PoP, resp.StatusCode, body, time.Since(start))
	}
	return b.String()
}
