package mixedversion

import (
	"bytes"
	"context"
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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/regionctl"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// The region every edge of the tests runs in (the Consul datacenter).
const regionName = "mixed"

// The rules of the region: an exact limit and a leased one, per client IP,
// an hour's window each so that no window ends while a test counts.
const (
	exactLimit  = 60
	leasedLimit = 100
	// leasedCarved is what a leased fixed window admits at most:
	// L + ⌊L·t⌋ (docs/guarantees.md, "Leased rules").
	leasedCarved = leasedLimit + leasedLimit*5/100
	rulesDoc     = `
version: 1
rules:
  - id: exact
    match:
      path_prefix: ["/exact"]
    key: [ip]
    algorithm: fixed_window
    limit: 60
    window: 1h
  - id: leased
    match:
      path_prefix: ["/leased"]
    key: [ip]
    algorithm: fixed_window
    limit: 100
    window: 1h
    accuracy: leased
    tolerance: 0.05
`
)

// fleetEnv is what every fleet test shares, set up on first use: both
// edge binaries, one Redis Cluster and one Consul agent holding the rules.
type fleetEnv struct {
	release          release
	oldBin, newBin   string
	cluster          *testenv.Cluster
	consul           *testenv.Consul
	origin           *httptest.Server
	oldBuilt, newDur time.Duration // how long building each took
}

var (
	fleetOnce sync.Once
	fleet     *fleetEnv
	fleetErr  error
	closers   []func()
	tmpDir    string
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	code := m.Run()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// setup returns the shared fleet environment, failing the test (never
// skipping it) when the release cannot be found or built.
func setup(t *testing.T) *fleetEnv {
	t.Helper()
	fleetOnce.Do(func() { fleet, fleetErr = newFleetEnv() })
	require.NoError(t, fleetErr, "setting up the mixed-version fleet")
	t.Logf("release %s (%s), built in %s (0: cached); this tree's edge built in %s",
		fleet.release.Version, fleet.release.Commit, fleet.oldBuilt.Round(time.Millisecond), fleet.newDur.Round(time.Millisecond))
	return fleet
}

func newFleetEnv() (*fleetEnv, error) {
	f := &fleetEnv{}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	if f.release, err = findRelease(root); err != nil {
		return nil, err
	}
	if f.oldBin, f.oldBuilt, err = releaseEdge(root, f.release); err != nil {
		return nil, err
	}
	if tmpDir, err = os.MkdirTemp("", "edgeguard-mixed-"); err != nil {
		return nil, err
	}
	closers = append(closers, func() { os.RemoveAll(tmpDir) })
	start := time.Now()
	f.newBin = filepath.Join(tmpDir, "edge")
	if err := testenv.BuildEdge(f.newBin); err != nil {
		return nil, err
	}
	f.newDur = time.Since(start)
	if f.cluster, err = testenv.StartCluster(testenv.ClusterOptions{}); err != nil {
		return nil, fmt.Errorf("starting redis cluster: %w", err)
	}
	closers = append(closers, func() { _ = f.cluster.Close() })
	if f.consul, err = testenv.StartConsul(testenv.ConsulOptions{Datacenter: regionName}); err != nil {
		return nil, fmt.Errorf("starting consul: %w", err)
	}
	closers = append(closers, func() { _ = f.consul.Close() })
	f.origin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	closers = append(closers, f.origin.Close)
	// The rules go in as an operator pushes them, before any edge starts.
	file := filepath.Join(tmpDir, "rules.yaml")
	if err := os.WriteFile(file, []byte(rulesDoc), 0o600); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if code := regionctl.Main([]string{"--consul", f.consul.HTTPAddr(), "rules", "push", "--all", "--message", "mixed-version test", file},
		func(string) string { return "" }, &out, &out); code != 0 {
		return nil, fmt.Errorf("regionctl rules push: exit %d: %s", code, out.String())
	}
	return f, nil
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

// edge is one running edge process.
type edge struct {
	*testenv.Proc
	name        string // "0.1.0" or "HEAD", and its place in the fleet
	version     int    // previous or current
	Addr, Admin string
	out         *syncBuffer
	stopped     bool
}

// startEdge starts bin as an edge of the region on fresh loopback ports
// (Redis Cluster, rules from Consul, the key salt of the test) and waits
// until /readyz answers 200. nodes is --nodes-in-region.
func startEdge(t *testing.T, f *fleetEnv, bin, name, salt string, nodes int) *edge {
	t.Helper()
	const attempts = 4
	for attempt := 1; ; attempt++ {
		ports, err := testenv.FreePorts(2)
		require.NoError(t, err)
		e := &edge{name: name, out: &syncBuffer{},
			Addr:  "127.0.0.1:" + strconv.Itoa(ports[0]),
			Admin: "127.0.0.1:" + strconv.Itoa(ports[1])}
		cmd := exec.Command(bin,
			"--listen", e.Addr, "--admin", e.Admin, "--drain-delay", "0",
			"--origin", f.origin.URL,
			"--redis", f.cluster.URL(), "--redis-mode", "cluster",
			"--consul", f.consul.HTTPAddr(), "--region", regionName, "--pop", fmt.Sprintf("pop%d", ports[0]),
			"--rules-cache", filepath.Join(t.TempDir(), "rules.yaml"),
			"--trusted-proxies", "127.0.0.1", "--nodes-in-region", strconv.Itoa(nodes))
		cmd.Stdout, cmd.Stderr = e.out, e.out
		// Only what the flags say (no EDGEGUARD_* of the shell running the
		// tests, such as the Consul binary's path); the salt travels in
		// the environment, as the edge requires.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "EDGEGUARD_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "EDGEGUARD_KEY_SALT="+salt)
		e.Proc, err = testenv.StartProc(cmd)
		require.NoError(t, err)
		t.Cleanup(func() {
			e.stop(t)
			if t.Failed() {
				t.Logf("--- edge %s %s output (last 30 lines) ---\n%s", e.name, e.Addr, proc.LastLines(e.out.String(), 30))
			}
		})
		err = waitReady(e, 30*time.Second)
		if err == nil {
			return e
		}
		if !e.Alive() && attempt < attempts && strings.Contains(e.out.String(), "address already in use") {
			// Another process took a port between FreePorts and the
			// edge's bind: this edge refused to start (exit 1), which
			// its cleanup must not report as a failed stop.
			e.stopped = true
			continue
		}
		t.Fatalf("edge %s did not become ready: %v\n--- output ---\n%s", name, err, proc.LastLines(e.out.String(), 30))
	}
}

// stop ends the edge as an orchestrator does in a rolling upgrade: SIGTERM,
// and it drains and exits (a leased edge gives back what it holds).
func (e *edge) stop(t *testing.T) {
	t.Helper()
	if e.stopped {
		return
	}
	e.stopped = true
	if code, ok := e.Stop(15 * time.Second); !ok {
		t.Errorf("edge %s %s did not exit within 15 s of SIGTERM", e.name, e.Addr)
	} else if code != 0 {
		t.Errorf("edge %s %s exited with %d after SIGTERM", e.name, e.Addr, code)
	}
}

func waitReady(e *edge, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	exited := false
	err := proc.PollEvery(ctx, 20*time.Millisecond, "/readyz to answer 200", func(context.Context) error {
		if !e.Alive() {
			exited = true
			return nil
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
	return err
}
