package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/promtext"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// What every test of the package shares: the edge binary, built once
// (without -race: the edges are the system under test, not the test), and a
// Redis Cluster for the non-destructive tests, which namespace their Redis
// keys with a per-test --key-salt. Failover tests start their own
// deployments.
var (
	edgeBin string
	cluster *testenv.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// quietLogger drops go-redis's own log lines in the test process.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func run(m *testing.M) int {
	flag.Parse() // for testing.Verbose
	redis.SetLogger(quietLogger{})
	dir, err := os.MkdirTemp("", "edgeguard-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Whatever happens to the tests, no edge outlives the run (Pdeathsig
	// covers a crash of the test binary itself).
	defer killAllEdges()

	// The build (the linker, mostly) and the Cluster's start (mostly
	// waiting for its nodes to agree) overlap.
	start := time.Now()
	edgeBin = filepath.Join(dir, "edge")
	var built time.Duration
	buildErr := make(chan error, 1)
	go func() {
		err := testenv.BuildEdge(edgeBin)
		built = time.Since(start)
		buildErr <- err
	}()
	cluster, err = testenv.StartCluster(testenv.ClusterOptions{})
	clusterUp := time.Since(start)
	if err == nil {
		defer cluster.Close()
	}
	if berr := <-buildErr; berr != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the edge:", berr)
		return 1
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting redis cluster:", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: edge built in %s, cluster up in %s (side by side: %s)\n",
			built.Round(time.Millisecond), clusterUp.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// ---------------------------------------------------------------------------
// Edge processes.

var (
	edgesMu sync.Mutex
	edges   = map[*edgeProc]struct{}{}
)

func killAllEdges() {
	edgesMu.Lock()
	defer edgesMu.Unlock()
	for e := range edges {
		e.Kill()
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// edgeProc is one running edge binary, supervised by the harness.
type edgeProc struct {
	*testenv.Proc
	Addr, Admin string      // host:port of the public and the admin listener
	out         *syncBuffer // stderr (JSON log) and stdout
}

func (e *edgeProc) url(path string) string { return "http://" + e.Addr + path }

// logTail returns the last lines of the edge's output, for failure messages.
func (e *edgeProc) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(e.out.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// spawnEdge starts the edge binary with args as they are; the process is
// stopped (SIGTERM, then SIGKILL) when the test ends.
func spawnEdge(t testing.TB, args ...string) *edgeProc {
	t.Helper()
	e := &edgeProc{out: &syncBuffer{}}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--listen":
			e.Addr = args[i+1]
		case "--admin":
			e.Admin = args[i+1]
		}
	}
	// Secrets travel in the environment, as the edge requires: a
	// --key-salt among args is passed as EDGEGUARD_KEY_SALT.
	var secrets []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--key-salt" && i+1 < len(args) {
			secrets = append(secrets, "EDGEGUARD_KEY_SALT="+args[i+1])
			args = append(args[:i:i], args[i+2:]...)
			i--
		}
	}
	cmd := exec.Command(edgeBin, args...)
	cmd.Stdout, cmd.Stderr = e.out, e.out
	// Only what the flags say: no EDGEGUARD_* from the developer's shell.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGEGUARD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(secrets, "EDGEGUARD_ADMIN_TOKEN="+adminToken)...)
	// Its own process group, and SIGKILL when the test binary dies, so no
	// edge leaks even if a test panics.
	var err error
	e.Proc, err = testenv.StartProc(cmd)
	require.NoError(t, err)
	edgesMu.Lock()
	edges[e] = struct{}{}
	edgesMu.Unlock()
	t.Cleanup(func() {
		if _, ok := e.Stop(10 * time.Second); !ok {
			t.Errorf("edge %s did not exit within 10s of SIGTERM", e.Addr)
		}
		edgesMu.Lock()
		delete(edges, e)
		edgesMu.Unlock()
		if t.Failed() {
			t.Logf("--- edge %s output (last 40 lines) ---\n%s", e.Addr, e.logTail(40))
		}
	})
	return e
}

// adminToken is every test edge's admin token (its /debug endpoints).
const adminToken = "e2e-admin-token"

// startEdge starts an edge on fresh loopback ports with --drain-delay 0 and
// args (a later flag wins, except --origin and --trusted-proxies, which
// add up), and waits until /readyz answers 200. A port another process took
// between picking and binding is retried with fresh ones.
func startEdge(t testing.TB, args ...string) *edgeProc {
	t.Helper()
	const attempts = 4
	for attempt := 1; ; attempt++ {
		ports := freePorts(t, 2)
		e := spawnEdge(t, append([]string{
			"--listen", "127.0.0.1:" + strconv.Itoa(ports[0]),
			"--admin", "127.0.0.1:" + strconv.Itoa(ports[1]),
			"--drain-delay", "0",
		}, args...)...)
		err := waitReady(e, 20*time.Second)
		if err == nil {
			return e
		}
		if !e.Alive() && attempt < attempts && strings.Contains(e.out.String(), "address already in use") {
			continue
		}
		t.Fatalf("edge did not become ready: %v\n--- output ---\n%s", err, e.logTail(40))
	}
}

// waitReady polls /readyz until it answers 200, the process exits or the
// deadline passes.
func waitReady(e *edgeProc, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	exited := false
	err := proc.PollEvery(ctx, 10*time.Millisecond, "/readyz to answer 200", func(context.Context) error {
		if !e.Alive() {
			exited = true
			return nil // nothing left to wait for
		}
		resp, err := c.Get("http://" + e.Admin + "/readyz")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		return nil
	})
	if exited {
		return fmt.Errorf("process exited (%s)", e.Cmd.ProcessState)
	}
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	return nil
}

// freePorts picks n distinct free loopback ports.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := testenv.FreePorts(n)
	require.NoError(t, err)
	return ports
}

// closedAddr is a loopback address nothing listens on (reserved for the
// test: no other test can start listening there meanwhile).
func closedAddr(t *testing.T) string { return testenv.ClosedAddr(t) }

// writeRules writes a rules file into the test's temp dir.
func writeRules(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	return path
}

// ---------------------------------------------------------------------------
// The origin and clients.

// origin is an HTTP origin in the test process; every request waits delay
// and answers 200 "ok".
type origin struct {
	URL     string
	arrived atomic.Int64
}

func startOrigin(t *testing.T, delay time.Duration) *origin {
	o := &origin{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.arrived.Add(1)
		if delay > 0 {
			time.Sleep(delay) // kept: the origin's service time is the subject
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(srv.Close)
	o.URL = srv.URL
	return o
}

// newClient is an HTTP client keeping up to conns connections per edge.
func newClient(t *testing.T, conns int) *http.Client {
	tr := &http.Transport{
		MaxIdleConns:        4 * conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}
}

// reply is one response, read in full.
type reply struct {
	code   int
	header http.Header
	body   []byte
	err    error
}

// get sends GET url with header name/value pairs.
func get(c *http.Client, url string, headers ...string) reply {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return reply{err: err}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return reply{code: resp.StatusCode, header: resp.Header, body: body, err: err}
}

// ---------------------------------------------------------------------------
// Metrics: the Prometheus text format the admin port serves.

// metrics is one scrape, by family name.
type metrics = promtext.Families

func scrape(t *testing.T, e *edgeProc) metrics {
	t.Helper()
	m, err := scrapeErr(e)
	require.NoError(t, err)
	return m
}

var scrapeClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func scrapeErr(e *edgeProc) (metrics, error) {
	return promtext.Scrape(context.Background(), scrapeClient, "http://"+e.Admin+"/metrics")
}

// sum is promtext.Sum: the series of name whose labels include every pair
// of match (given as name, value, name, value...).
func sum(m metrics, name string, match ...string) float64 { return promtext.Sum(m, name, match...) }

// Metric names the tests read.
const (
	mDecisions      = "edgeguard_edge_decisions_total"
	mRequests       = "edgeguard_edge_requests_total"
	mStoreDecisions = "edgeguard_limiter_store_decisions_total"
	mStoreCalls     = "edgeguard_limiter_store_calls_total"
	mCoalesced      = "edgeguard_limiter_coalesced_checks_total"
	mFallback       = "edgeguard_limiter_fallback_total"
	mBreaker        = "edgeguard_limiter_breaker_state"
	mRefunds        = "edgeguard_limiter_refunds_total"
)

// ---------------------------------------------------------------------------
// Redis helpers.

// commandStats returns calls and failed_calls of one command from INFO
// commandstats on addr (zeros when the command was never called).
func commandStats(ctx context.Context, addr, command string) (calls, failed int64, err error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, DisableIdentity: true})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(v, ",") {
			k, n, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, err = strconv.ParseInt(n, 10, 64)
			case "failed_calls":
				failed, err = strconv.ParseInt(n, 10, 64)
			}
			if err != nil {
				return 0, 0, fmt.Errorf("parsing %q: %w", line, err)
			}
		}
	}
	return calls, failed, nil
}

// onNode runs fn with a client for addr.
func onNode(ctx context.Context, addr string, fn func(context.Context, *redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, DisableIdentity: true})
	defer c.Close()
	if err := fn(ctx, c); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	return nil
}
