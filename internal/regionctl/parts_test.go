package regionctl

import (
	"context"
	"encoding/json"
	"errors"
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

// customerRules is a per-customer-host document as a CDN runs it: one rule
// per customer host, plus one for every host. Customer special gets limit
// 1, so one can tell the rule is enforced. The customer rules are sliding
// logs, whose windows have no boundary on the clock: a count a test checks
// again a minute later holds whenever it runs (a fixed window of an hour
// started again on the hour, between two checks, under a busy machine).
func customerRules(n, special, specialLimit int) string {
	var b strings.Builder
	b.Grow(n * 140)
	b.WriteString("version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: sliding_window, limit: 100000, window: 1m}\n")
	for i := range n {
		limit := 600
		if i == special {
			limit = specialLimit
		}
		fmt.Fprintf(&b, "  - {id: cust-%06d, match: {hosts: [shop-%06d.example.net]}, key: [ip], algorithm: sliding_log, limit: %d, window: 1h}\n", i, i, limit)
	}
	return b.String()
}

// A 100,000-rule document (4,000 under -race, see race_test.go) does not
// fit one Consul value: regionctl stores it in parts, an edge loads it, a
// push interrupted between parts changes nothing, and the parts it left are
// collected by the next push.
func TestPushLargeDocumentInParts(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	start := time.Now()
	phase := func(name string) { t.Logf("%-40s %v", name, time.Since(start).Round(10*time.Millisecond)) }
	v1, v2, v3 := customerRules(largeRules, 42, 1), customerRules(largeRules, 42, 2), customerRules(largeRules, 7, 1)
	require.Greater(t, len(v1), region.PartSize)

	r := run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--output", "json", file(t, v1))
	require.Equal(t, ExitOK, r.code, r)
	res := decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	v1Version, v1Effective := res["document_version"].(string), res["version"].(string)

	// The key holds a manifest; the parts are each under Consul's limit.
	stored := kv(t, euWest, p+"rules/global")
	require.NotNil(t, stored)
	m1, err := region.ParseManifest(stored.Value)
	require.NoError(t, err)
	require.NotNil(t, m1, "not a manifest: %.200s", stored.Value)
	require.Equal(t, v1Version, m1.Version)
	require.Equal(t, len(v1), m1.Size)
	require.GreaterOrEqual(t, len(m1.Parts), (len(v1)+region.PartSize-1)/region.PartSize)
	require.LessOrEqual(t, len(m1.Parts), (len(v1)+region.PartSize-1)/region.PartSize+1)
	for _, part := range m1.Parts {
		pair := kv(t, euWest, part.Key)
		require.NotNil(t, pair, part.Key)
		require.LessOrEqual(t, len(pair.Value), 512<<10)
	}

	phase("pushed v1")
	// An edge loads it and reports its version to the catalog.
	e := startEdge(t, p)
	waitConverged(t, p, v1Effective)
	require.Equal(t, []int{http.StatusOK, http.StatusTooManyRequests}, hits(t, e, "shop-000042.example.net", 2), "customer 42's rule (limit 1) is enforced")
	require.Equal(t, []int{http.StatusOK, http.StatusOK}, hits(t, e, "shop-000043.example.net", 2))

	phase("edge converged on v1")
	// A push interrupted before its last part: nothing changes.
	a := &app{onPart: func(_ string, i, n int) error {
		if i == n-1 {
			return errors.New("interrupted")
		}
		return nil
	}}
	r = runApp(t, a, testEnv(), "rules", "push", "--prefix", p, "--region", "eu-west", "--global", file(t, v2))
	require.Equal(t, ExitError, r.code, r)
	require.Contains(t, r.stderr, fmt.Sprintf("part %d of %d: interrupted", len(m1.Parts), len(m1.Parts)))
	after := kv(t, euWest, p+"rules/global")
	require.Equal(t, stored.ModifyIndex, after.ModifyIndex, "the manifest was not touched")
	// Customer 42 is still at v1's limit of 1 (v2 would admit a second).
	require.Equal(t, []int{http.StatusTooManyRequests}, hits(t, e, "shop-000042.example.net", 1))
	orphans := partKeys(t, p)
	require.Greater(t, len(orphans), len(m1.Parts), "the interrupted push left parts")

	phase("interrupted push checked")
	// The next push lands, collects those parts, and the edge follows.
	r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", "--global", "--output", "json", file(t, v3))
	require.Equal(t, ExitOK, r.code, r)
	res = decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Greater(t, res["parts_collected"], float64(0), r)
	m3, err := region.ParseManifest(kv(t, euWest, p+"rules/global").Value)
	require.NoError(t, err)
	named := map[string]bool{}
	for _, part := range append(m1.Parts, m3.Parts...) {
		named[part.Key] = true
	}
	left := partKeys(t, p)
	require.Len(t, left, len(named), "exactly the parts of v1 (in history) and v3 remain")
	for _, k := range left {
		require.True(t, named[k], k)
	}
	phase("pushed v3")
	waitConverged(t, p, res["version"].(string))
	require.Equal(t, []int{http.StatusOK, http.StatusTooManyRequests}, hits(t, e, "shop-000007.example.net", 2))
	phase("edge converged on v3")

	// History and rollback work on documents in parts.
	r = run(t, "rules", "rollback", "--prefix", p, "--region", "eu-west", "--global", "--to", v1Version, "--output", "json")
	require.Equal(t, ExitOK, r.code, r)
	res = decodeJSON(t, r.stdout)["results"].([]any)[0].(map[string]any)
	require.Equal(t, v1Effective, res["version"])
	back, err := region.ParseManifest(kv(t, euWest, p+"rules/global").Value)
	require.NoError(t, err)
	require.Equal(t, m1.Parts, back.Parts, "the same parts, stored once")
	phase("rolled back")
}

// rules validate on a 100,000-rule document still names the rule and the
// field of every problem.
func TestValidateLargeDocument(t *testing.T) {
	t.Parallel()
	doc := customerRules(largeRules, 3_777, 0) // limit 0: invalid
	doc = strings.Replace(doc, "id: cust-001234, match: {hosts: [shop-001234.example.net]}", "id: cust-001234, match: {hosts: [shop_001234..example.net]}", 1)
	f := file(t, doc)
	start := time.Now()
	r := run(t, "rules", "validate", f)
	t.Logf("rules validate of %d rules: %v", largeRules, time.Since(start))
	require.Equal(t, ExitInvalid, r.code, r)
	require.Contains(t, r.stderr, f+": invalid (2 problems)")
	require.Contains(t, r.stderr, `rule "cust-003777": limit: must be > 0 (got 0)`)
	require.Contains(t, r.stderr, `rule "cust-001234": match.hosts`)
}

func partKeys(t *testing.T, p string) []string {
	t.Helper()
	c, err := euWest.Client(euWest.ManagementToken)
	require.NoError(t, err)
	keys, _, err := c.KV().Keys(p+"parts/", "", nil)
	require.NoError(t, err)
	return keys
}

// startEdge runs an edge of eu-west on prefix p.
func startEdge(t *testing.T, p string) *edge.Edge {
	t.Helper()
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = origin.Serve(ln) }()
	t.Cleanup(func() { _ = origin.Close() })

	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{"http://" + ln.Addr().String()}
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

// waitConverged polls regions status until eu-west expects version and its
// one edge runs it. Each status parses the whole document, so it polls
// every second.
func waitConverged(t *testing.T, p, version string) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 3*time.Minute), time.Second, "eu-west to converge on "+version, func(context.Context) error {
		last := run(t, "regions", "status", "--prefix", p, "--region", "eu-west", "--output", "json")
		if last.code != ExitOK {
			return fmt.Errorf("regions status: %s", last)
		}
		var out struct {
			Regions []regionStatus `json:"regions"`
		}
		if json.Unmarshal([]byte(last.stdout), &out) != nil || len(out.Regions) != 1 {
			return fmt.Errorf("not one region's status: %s", last)
		}
		if st := out.Regions[0]; st.ExpectedVersion != version || st.Healthy != 1 || !st.Converged {
			return fmt.Errorf("expected version %s, %v healthy, converged %v", st.ExpectedVersion, st.Healthy, st.Converged)
		}
		return nil
	})
	require.NoError(t, err)
}

// hits sends n requests for host to the edge and returns the status codes.
func hits(t *testing.T, e *edge.Edge, host string, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		req, err := http.NewRequest(http.MethodGet, "http://"+e.Addr()+"/", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

// An edge's watch passes a document stored in parts whole or not at all: a
// missing or altered part is reported and the caller keeps what it has,
// until the part is back.
func TestWatchLoadsWholeDocumentsOnly(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	doc := []byte(customerRules(3500, -1, 0))
	require.Greater(t, len(doc), region.PartSize, "two parts at least")
	cfg := api.DefaultConfig()
	cfg.Address = euWest.HTTPAddr()
	rc, err := region.NewClient(cfg, p)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = rc.Push(ctx, "eu-west", rc.Layout().GlobalRules(), doc, 0, region.Entry{Kind: region.KindGlobalRules, Version: "v"})
	require.NoError(t, err)
	m, err := region.ParseManifest(kv(t, euWest, p+"rules/global").Value)
	require.NoError(t, err)
	require.NotNil(t, m)

	// Take the second part away, then alter it.
	admin, err := euWest.Client(euWest.ManagementToken)
	require.NoError(t, err)
	key := m.Parts[1].Key
	pair := kv(t, euWest, key)
	_, err = admin.KV().Delete(key, nil)
	require.NoError(t, err)

	docs, errs := make(chan region.Docs, 10), make(chan error, 100)
	go rc.WatchRules(ctx, "eu-west", func(d region.Docs) { docs <- d }, func(err error) { errs <- err })
	waitErr := func(want string) {
		t.Helper()
		for {
			select {
			case err := <-errs:
				if strings.Contains(err.Error(), want) {
					return
				}
			case d := <-docs:
				t.Fatalf("a document went through with a part %s: %d bytes", want, len(d.Global))
			case <-ctx.Done():
				t.Fatalf("no error saying %q", want)
			}
		}
	}
	waitErr("is missing")
	_, err = admin.KV().Put(&api.KVPair{Key: key, Value: append([]byte("#"), pair.Value[1:]...)}, nil)
	require.NoError(t, err)
	waitErr("does not match its hash")

	_, err = admin.KV().Put(&api.KVPair{Key: key, Value: pair.Value}, nil)
	require.NoError(t, err)
	select {
	case d := <-docs:
		require.Equal(t, doc, d.Global)
	case <-ctx.Done():
		t.Fatal("the whole document never came")
	}
}
