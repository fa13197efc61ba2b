//go:build stack

// These tests bring a stack of their own up with scripts/stack.sh (state in
// a temp dir), run the k6 smoke, drills 1, 3, 5 and 6, a DNS drain test and a self-healing
// test against it, and take it down, checking nothing is left. The build
// tag keeps them out of `go test ./...`: `make stack-test` (part of `make
// test`) runs them once.
package drills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/stack"
	"github.com/edgeguard/edgeguard/internal/stack/resolver"
)

var (
	env     *Env
	root    string
	outputs string // the stack's outputs.json
	results []*Result
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root = filepath.Clean(filepath.Join(wd, "..", "..", ".."))
	state, err := os.MkdirTemp("", "edgeguard-stack-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(state)

	// The stack's ports are fixed: a stack already running (make stack-up)
	// would collide with this one.
	topo, err := stack.ReadTopology(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, a := range []string{
		net.JoinHostPort("127.0.0.1", strconv.Itoa(topo.Ports.Consul.HTTP)),
		net.JoinHostPort("127.0.1.1", strconv.Itoa(topo.Ports.Edge.HTTP)),
		net.JoinHostPort("127.0.0.1", strconv.Itoa(topo.Ports.Prometheus)),
	} {
		if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			c.Close()
			fmt.Fprintf(os.Stderr, "%s is taken: a stack is already running here (make stack-down first)\n", a)
			return 1
		}
	}
	start := time.Now()
	out, err := stackScript(state, "up")
	up := time.Since(start)
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "stack up failed: %v\n%s\n", err, out)
	} else {
		fmt.Fprintf(os.Stderr, "stack up in %s\n", up.Round(time.Second))
		outputs = filepath.Join(state, "outputs.json")
		env, err = NewEnv(outputs, root, os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		} else {
			code = m.Run()
		}
	}
	if len(results) > 0 {
		_ = PrintTable(os.Stderr, results)
	}

	// Down, then nothing may be left: no process of the stack, no listener
	// on its ports, no file.
	t0 := time.Now()
	if out, err := stackScript(state, "down"); err != nil {
		fmt.Fprintf(os.Stderr, "stack down failed: %v\n%s\n", err, out)
		return 1
	}
	if err := leftovers(state); err != nil {
		fmt.Fprintln(os.Stderr, "stack down left something behind:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "stack down in %s; no process, port or file left (whole run %s)\n", time.Since(t0).Round(time.Second), time.Since(start).Round(time.Second))
	return code
}

func stackScript(state, cmd string) (string, error) {
	c := exec.Command(filepath.Join(root, "scripts", "stack.sh"), cmd)
	c.Dir = root
	c.Env = append(os.Environ(), "STACK_STATE="+state)
	out, err := c.CombinedOutput()
	return string(out), err
}

// leftovers reports the state dir, processes started from it and
// listeners on the stack's addresses that survived stack-down.
func leftovers(state string) error {
	var errs []error
	if _, err := os.Stat(state); err == nil {
		errs = append(errs, fmt.Errorf("state dir %s still exists", state))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), state) {
			errs = append(errs, fmt.Errorf("process %s still runs: %s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(data), "\x00", " ")))
		}
	}
	if env != nil {
		var addrs []string
		for _, r := range env.Out.Regions {
			addrs = append(addrs, r.Redis.Nodes...)
			addrs = append(addrs, r.Redis.Seeds...)
			addrs = append(addrs, strings.TrimPrefix(r.Consul.HTTP, "http://"), strings.TrimPrefix(r.Origin, "http://"))
			for _, e := range r.Edges() {
				addrs = append(addrs, strings.TrimPrefix(e.URL, "http://"), e.TLS, strings.TrimPrefix(e.Admin, "http://"), e.RLS)
			}
		}
		addrs = append(addrs, strings.TrimPrefix(env.Out.PrometheusURL, "http://"))
		for _, a := range addrs {
			if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
				c.Close()
				errs = append(errs, fmt.Errorf("%s still accepts connections", a))
			}
		}
	}
	return errors.Join(errs...)
}

// Terraform's plan after an apply is empty: nothing in the configuration
// changes by itself (reconcile runs beside Terraform, not as a resource
// replaced on every apply).
func TestPlanAfterApplyIsEmpty(t *testing.T) {
	c := exec.Command(filepath.Join(root, "scripts", "stack.sh"), "plan")
	c.Dir = root
	c.Env = append(os.Environ(), "STACK_STATE="+env.Out.StateDir)
	out, err := c.CombinedOutput()
	require.NoError(t, err, "terraform plan -detailed-exitcode: 2 means changes:\n%s", proc.LastLines(string(out), 40))
	require.Contains(t, string(out), "No changes.")
}

// Every edge serves HTTPS for the stack's name with the certificate the
// stack put into its region's Consul KV (no file on the edges), over HTTP/2
// and HTTP/1.1, and the region's rules apply there as over plain HTTP: a
// burst of one client over one HTTP/2 connection past drill-exact's 20 in
// 2 s is denied with the same fields.
func TestEveryEdgeServesTLS(t *testing.T) {
	st := stack.State{Dir: env.Out.StateDir}
	cfg, err := st.TLSClientConfig()
	require.NoError(t, err)
	require.Equal(t, stack.TLSName, env.Out.TLS.Name)
	clients := 0
	for _, name := range slices.Sorted(maps.Keys(env.Out.Regions)) {
		for _, e := range env.Out.Regions[name].Edges() {
			for _, h2 := range []bool{true, false} {
				c := cfg.Clone()
				if !h2 {
					c.NextProtos = []string{"http/1.1"}
				}
				tr := &http.Transport{
					TLSClientConfig:   c,
					ForceAttemptHTTP2: h2,
					DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
						return (&net.Dialer{}).DialContext(ctx, network, e.TLS)
					},
				}
				cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
				path := fmt.Sprintf("https://%s/drill/tls-%s-%v", stack.TLSName, e.Name, h2)
				// A client of its own (the stack trusts loopback's
				// forwarding fields), so drill-exact starts from zero.
				clients++
				client := fmt.Sprintf("198.18.%d.%d", clients/250, clients%250+1)
				get := func() (*http.Response, error) {
					req, err := http.NewRequest(http.MethodGet, path, nil)
					if err != nil {
						return nil, err
					}
					req.Header.Set("X-Forwarded-For", client)
					return cl.Do(req)
				}
				resp, err := get()
				require.NoError(t, err, e.Name)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode, e.Name)
				require.Equal(t, h2, resp.ProtoMajor == 2, "%s: protocol %s", e.Name, resp.Proto)
				require.Contains(t, resp.Header.Get("RateLimit-Policy"), `"drill-exact";q=20;w=2`, e.Name)
				if h2 {
					// 30 at once on the same connection: at least 10 over.
					codes := make(chan int, 30)
					for range 30 {
						go func() {
							r, err := get()
							if err != nil {
								codes <- 0
								return
							}
							_ = r.Body.Close()
							if r.StatusCode == http.StatusTooManyRequests && r.Header.Get("Retry-After") == "" {
								codes <- -1
								return
							}
							codes <- r.StatusCode
						}()
					}
					got := map[int]int{}
					for range 30 {
						got[<-codes]++
					}
					require.GreaterOrEqual(t, got[http.StatusTooManyRequests], 10, "%s: %v", e.Name, got)
					require.Zero(t, got[0]+got[-1], "%s: errors or 429 without Retry-After: %v", e.Name, got)
				}
				tr.CloseIdleConnections()
			}
		}
	}
}

// The load-test kit's CI smoke on the same stack: 20 s of
// loadtest/scenarios/multi-region.js through both regions' DNS, with the
// correctness thresholds only (over-admission, false denials, broken retry
// promises, malformed fields, errors). k6 comes from make k6's cache. The
// regions reach each other's Redis over drill 6's WAN-like link meanwhile,
// so the global rule's roaming clients (roam-global) lease across it; the
// checker must have judged that rule's admissions and denials over both
// regions, the most in one window within its bound.
func TestLoadtestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var out []byte
	joined, err := env.OverWAN(ctx, func(ctx context.Context) error {
		c := exec.CommandContext(ctx, filepath.Join(root, "loadtest", "run.sh"), "multi-region")
		c.Dir = root
		c.Env = append(os.Environ(), "SMOKE=1", "STACK_OUTPUTS="+outputs, "EDGEGUARD_RESULTS="+dir)
		var err error
		out, err = c.CombinedOutput()
		return err
	})
	t.Logf("k6 multi-region smoke over the WAN link (joined in %s):\n%s", joined.Round(time.Millisecond), proc.LastLines(string(out), 70))
	require.NoError(t, err, "the smoke's thresholds failed (k6 exits non-zero), or the link did not come up")

	files, err := filepath.Glob(filepath.Join(dir, "multi-region-smoke-*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	var doc struct {
		Edgeguard struct {
			Checker struct {
				Stats struct {
					ByPolicy map[string]struct {
						Admissions   int64            `json:"admissions_judged"`
						Denials      int64            `json:"denials_judged"`
						MostInWindow int64            `json:"most_in_window"`
						Findings     map[string]int64 `json:"findings"`
					} `json:"by_policy"`
				} `json:"stats"`
				Policies []struct {
					Name  string `json:"name"`
					Quota int64  `json:"q"`
					Bound int64  `json:"bound"`
					Scope string `json:"scope"`
				} `json:"policies"`
			} `json:"checker"`
		} `json:"edgeguard"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	const rule = "roam-global"
	var bound, quota int64
	for _, p := range doc.Edgeguard.Checker.Policies {
		if p.Name == rule {
			require.Equal(t, "all regions", p.Scope)
			bound, quota = p.Bound, p.Quota
		}
	}
	ps, ok := doc.Edgeguard.Checker.Stats.ByPolicy[rule]
	require.True(t, ok, "the checker did not check %s's counts", rule)
	r := newResult("k6 smoke: " + rule + " over the WAN")
	r.Counts["admissions_judged"], r.Counts["denials_judged"] = int(ps.Admissions), int(ps.Denials)
	r.Counts["most_in_window"], r.Counts["bound"] = int(ps.MostInWindow), int(bound)
	r.Counts["over_admission"], r.Counts["false_denials"] = int(ps.Findings["over_admission"]), int(ps.Findings["false_denial"])
	r.Counts["broken_promises"] = int(ps.Findings["broken_promise"])
	r.Times["wan_joined"] = joined
	results = append(results, r)
	t.Logf("%s (q=%d): %v", rule, quota, r.Counts)
	require.Positive(t, ps.Admissions, "no admission of %s judged", rule)
	require.Positive(t, ps.Denials, "no denial of %s judged: no client reached the limit", rule)
	require.LessOrEqual(t, ps.MostInWindow, bound)
	require.Zero(t, ps.Findings["over_admission"])
	// A leased rule's design allows a few false denials (a key's allowance
	// held by the other region) and broken retry promises (a denial while
	// the allowance is refilled gives an estimate): each at most 1 % of the
	// judged decisions.
	require.LessOrEqual(t, 100*ps.Findings["false_denial"], ps.Admissions+ps.Denials,
		"false denials of %s over 1 %% of its judged decisions", rule)
	require.LessOrEqual(t, 100*ps.Findings["broken_promise"], ps.Admissions+ps.Denials,
		"broken retry promises of %s over 1 %% of its judged decisions", rule)
}

// The region-wide enforcement switch takes effect on every edge of the
// region within 1 s of the push, p99 over 20 pushes per region.
func TestDrill5EnforcementSwitch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := env.Drill5(ctx, 20)
	results = append(results, r)
	require.NoError(t, r.Err, r.Drill)
	t.Logf("%s: %d pushes, %d edge switches; p50 %s, p99 %s, max %s", r.Drill, r.Counts["pushes"], r.Counts["edge_switches"],
		r.Times["p50"], r.Times["p99"], r.Times["max"])
}

// A global rule over both regions, each reaching the other's Redis over a
// WAN-like link: one quota for roaming clients whichever region is the
// key's home (the Sentinel region or the Cluster region), an under-limit
// client (almost) never denied, a partition decided from the static share
// within its bound, and its debts paid once on the heal.
func TestDrill6GlobalRule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	r := env.Drill6(ctx)
	results = append(results, r)
	require.NoError(t, r.Err, r.Drill)
	t.Logf("%s in %s: %v %v", r.Drill, time.Since(start).Round(time.Second), r.Counts, r.Times)
}

func TestDrill1RedisMasterKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, r := range env.Drill1(ctx) {
		results = append(results, r)
		require.NoError(t, r.Err, r.Drill)
	}
}

// A draining edge (SIGTERM → /readyz 503) leaves the answers of a real DNS
// query within check interval (2 s) + TTL (0 s) + 1 s.
func TestDrainingEdgeLeavesDNS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, name, err := env.FailoverPair()
	require.NoError(t, err)
	region := env.Out.Regions[name]
	res, err := resolver.New(region.Consul.DNS)
	require.NoError(t, err)
	edges := region.Edges()
	require.GreaterOrEqual(t, len(edges), 2)
	var all []netip.Addr
	for _, e := range edges {
		all = append(all, netip.MustParseAddr(e.Addr))
	}
	slices.SortFunc(all, func(a, b netip.Addr) int { return a.Compare(b) })
	got, err := res.Lookup(ctx, env.Out.DNSQuery)
	require.NoError(t, err)
	require.Equal(t, all, got, "every healthy edge of %s answers", name)

	drained := edges[len(edges)-1]
	pid, err := env.signalProc(stack.EdgeID(drained.Name), "edge", syscall.SIGTERM)
	require.NoError(t, err)
	sent := time.Now()
	// Witness: the edge is draining.
	_, err = waitFor(ctx, 2*time.Second, drained.Name+" /readyz to report draining", func(ctx context.Context) error {
		if c := status(ctx, drained.Admin+"/readyz"); c != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz %d", c)
		}
		return nil
	})
	require.NoError(t, err)
	_, err = waitFor(ctx, 10*time.Second, "DNS to drop "+drained.Addr, func(ctx context.Context) error {
		got, err := res.Lookup(ctx, env.Out.DNSQuery)
		if err != nil {
			return err
		}
		if slices.Contains(got, netip.MustParseAddr(drained.Addr)) {
			return fmt.Errorf("still answers %v", got)
		}
		if len(got) != len(all)-1 {
			return fmt.Errorf("answers %v", got)
		}
		return nil
	})
	took := time.Since(sent)
	require.NoError(t, err)
	r := newResult("dns drain (" + drained.Name + ")")
	r.Times["left_dns"] = took
	results = append(results, r)
	require.LessOrEqual(t, took, 3*time.Second, "check interval 2s + TTL 0s + 1s")
	_, err = waitFor(ctx, 20*time.Second, drained.Name+" to exit", func(context.Context) error {
		if !gone(pid) {
			return errors.New("still running")
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, env.reconcile(ctx))
	got, err = res.Lookup(ctx, env.Out.DNSQuery)
	require.NoError(t, err)
	require.Equal(t, all, got, "the reconciled edge is back in DNS")
}

func TestDrill3ConsulDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r := env.Drill3(ctx, sortedNames(env.Out.Regions)[0])
	results = append(results, r)
	require.NoError(t, r.Err)
}

// After an edge and a Redis node are killed, applying again (what `make
// stack-up` does) brings everything back to ready.
func TestReapplyHealsKilledEdgeAndRedisNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name, region, err := env.regionOfMode("cluster")
	require.NoError(t, err)
	edge := region.Edges()[0]
	edgePid, err := env.signalProc(stack.EdgeID(edge.Name), "edge", syscall.SIGKILL)
	require.NoError(t, err)
	node := region.Redis.Nodes[len(region.Redis.Nodes)-1]
	nodePid, err := env.killNode(stack.RedisID(name), node)
	require.NoError(t, err)
	// Witness: both are gone.
	_, err = waitFor(ctx, 5*time.Second, "killed processes to exit", func(context.Context) error {
		if !gone(edgePid) || !gone(nodePid) {
			return errors.New("still running")
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 0, status(ctx, edge.Admin+"/healthz"))

	t0 := time.Now()
	out, err := stackScript(env.Out.StateDir, "up")
	require.NoError(t, err, out)
	r := newResult("self-healing re-apply")
	r.Times["apply"] = time.Since(t0)
	results = append(results, r)

	require.Equal(t, http.StatusOK, status(ctx, edge.Admin+"/readyz"))
	require.NoError(t, enforces(ctx, edge.URL))
	info, err := nodeInfo(ctx, node)
	require.NoError(t, err, "killed redis node is back")
	require.Contains(t, []string{"master", "slave"}, info["role"])
	st := stack.State{Dir: env.Out.StateDir}
	comps, err := st.Status()
	require.NoError(t, err)
	for _, c := range comps {
		require.Empty(t, c.Dead, "%s has dead processes", c.ID)
	}
}
