package regionctl

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// namedOrigin serves its name to every request.
func namedOrigin(t *testing.T, name string) string {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// bigHostTable is a table of n hosts h<i>.shop.example.com, host i in pool
// odd or even by i's parity, or the other way round when swapped.
func bigHostTable(n int, odd, even string, swapped bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: 1\npools:\n  odd: {urls: [%q]}\n  even: {urls: [%q]}\nhosts:\n", odd, even)
	for i := range n {
		pool := []string{"even", "odd"}[i%2]
		if swapped {
			pool = []string{"odd", "even"}[i%2]
		}
		fmt.Fprintf(&b, "  h%06d.shop.example.com: {pool: %s}\n", i, pool)
	}
	return b.String()
}

// A host table over InlineMax goes to Consul in parts with regionctl hosts
// push, and a real edge's watch reads it whole: a request for its last
// host reaches that host's pool. A second table keeps the first's parts
// while history names them (collecting deletes none of them), hosts get
// and diff read the stored table whole, a canary of such a table is
// refused as it cannot be one Consul value, and a rollback to the first
// table brings its routing back.
//
// Not parallel: its edge registers in eu-west, where
// TestPushLargeDocumentInParts waits for the region's one edge to converge.
// A test that runs alone has its edge deregistered (at its cleanup) before
// the parallel tests start.
func TestHostsTableInPartsReachesTheEdge(t *testing.T) {
	p := prefix(t)
	odd, even := namedOrigin(t, "odd"), namedOrigin(t, "even")
	v1 := bigHostTable(largeHosts, odd, even, false)
	v2 := bigHostTable(largeHosts, odd, even, true)
	require.Greater(t, len(v1), region.InlineMax)
	last := fmt.Sprintf("h%06d.shop.example.com", largeHosts-1) // odd in v1

	r := run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--yes", hostsFile(t, v1))
	require.Equal(t, ExitOK, r.code, r)
	m1, err := region.ParseManifest(kv(t, euWest, p+"hosts/eu-west").Value)
	require.NoError(t, err)
	require.NotNil(t, m1, "stored in parts")

	e := startHostsEdge(t, p)
	waitRouted(t, e, last, "odd")
	require.Equal(t, "even", get(t, e, "h000000.shop.example.com"))
	require.Equal(t, "default", get(t, e, "elsewhere.example.com"))

	r = run(t, "hosts", "get", "--prefix", p, "--region", "eu-west")
	require.Equal(t, ExitOK, r.code, r)
	require.True(t, strings.HasSuffix(r.stdout, "\n"+v1), "the whole table")
	r = run(t, "hosts", "diff", "--prefix", p, "--region", "eu-west", hostsFile(t, v1))
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "no changes")

	// A canary of a table in parts: refused, nothing written.
	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--yes", "--canary", "ams", "--for", "1s",
		"--prometheus", "http://127.0.0.1:1", hostsFile(t, v2))
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, fmt.Sprintf("--canary takes host tables up to %d bytes (one Consul value); this one is %d: push it without --canary", region.InlineMax, len(v2)))
	require.Nil(t, kv(t, euWest, p+"hosts/canary/eu-west/ams"))

	r = run(t, "hosts", "push", "--prefix", p, "--region", "eu-west", "--yes", hostsFile(t, v2))
	require.Equal(t, ExitOK, r.code, r)
	waitRouted(t, e, last, "even")

	// History names v1's parts: collecting keeps them and v2's.
	cfg := api.DefaultConfig()
	cfg.Address = euWest.HTTPAddr()
	rc, err := region.NewClient(cfg, p)
	require.NoError(t, err)
	n, err := rc.CollectParts(testenv.Within(t, time.Minute), "eu-west")
	require.NoError(t, err)
	require.Zero(t, n)
	for _, part := range m1.Parts {
		require.NotNil(t, kv(t, euWest, part.Key), part.Key)
	}

	r = run(t, "hosts", "rollback", "--prefix", p, "--region", "eu-west", "--yes")
	require.Equal(t, ExitOK, r.code, r)
	require.Contains(t, r.stdout, "rolled the host table back")
	back, err := region.ParseManifest(kv(t, euWest, p+"hosts/eu-west").Value)
	require.NoError(t, err)
	require.Equal(t, m1.Parts, back.Parts, "the same parts, stored once")
	waitRouted(t, e, last, "odd")
}

// startHostsEdge runs an edge of eu-west on prefix p whose own pool
// answers "default".
func startHostsEdge(t *testing.T, p string) *edge.Edge {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{namedOrigin(t, "default")}
	cfg.DrainDelay = 0
	cfg.Region, cfg.PoP = "eu-west", "ams"
	cfg.Consul, cfg.ConsulPrefix = euWest.HTTPAddr(), p
	cfg.RulesCache = t.TempDir() + "/rules.yaml"
	e, err := edge.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// get returns the body the edge answers for host.
func get(t *testing.T, e *edge.Edge, host string) string {
	t.Helper()
	body, err := fetchHost(e, host)
	require.NoError(t, err)
	return body
}

func fetchHost(e *edge.Edge, host string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+e.Addr()+"/", nil)
	if err != nil {
		return "", err
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return string(body), err
}

// waitRouted polls until the edge sends host to the origin named want.
func waitRouted(t *testing.T, e *edge.Edge, host, want string) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 2*time.Minute), 100*time.Millisecond, host+" to reach "+want, func(context.Context) error {
		got, err := fetchHost(e, host)
		if err == nil && got != want {
			err = fmt.Errorf("reached %q", got)
		}
		return err
	})
	require.NoError(t, err)
}
