package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// upgradeEdge is an edge started from its own copy of the binary, so a
// test can replace the file as an operator installing a new version does.
type upgradeEdge struct {
	*edgeProc
	bin     string // the path the edge re-reads on SIGUSR2
	log     string // every generation's output: a file, so the edge's exit is not held up by a pipe its successor still writes to
	tlsAddr string
	rlsAddr string // the rate limit service's
	pool    *tls.Config
}

// extra are more flags for the edge.
func startUpgradeEdge(t *testing.T, extra ...string) *upgradeEdge {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "edge")
	data, err := os.ReadFile(edgeBin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	ca := testenv.NewCA(t)
	cert := filepath.Join(dir, "cert.pem")
	require.NoError(t, os.WriteFile(cert, ca.Issue(t, "ecdsa", "localhost").Bundle(), 0o600))
	org := startOrigin(t, 0)
	rlsDir := filepath.Join(dir, "rls")
	require.NoError(t, os.Mkdir(rlsDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(rlsDir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"), 0o600))
	ports := freePorts(t, 4)
	u := &upgradeEdge{edgeProc: &edgeProc{}, bin: bin, log: filepath.Join(dir, "edge.log"), tlsAddr: "127.0.0.1:" + strconv.Itoa(ports[2])}
	logFile, err := os.Create(u.log)
	require.NoError(t, err)
	defer logFile.Close() // the edge holds its own copy
	u.Addr, u.Admin = "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
	u.rlsAddr = "127.0.0.1:" + strconv.Itoa(ports[3])
	u.pool = &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"}
	args := []string{"--listen", u.Addr, "--admin", u.Admin, "--listen-tls", u.tlsAddr,
		"--tls-default-cert", cert, "--origin", org.URL, "--drain-delay", "0",
		"--rls-listen", u.rlsAddr, "--rls-config-dir", rlsDir}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGEGUARD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "EDGEGUARD_ADMIN_TOKEN="+adminToken)
	u.Proc, err = testenv.StartProc(cmd)
	require.NoError(t, err)
	u.stopGroupAtEnd(t)
	require.NoError(t, waitReady(u.edgeProc, 20*time.Second), u.logTail(20))
	return u
}

// stopGroupAtEnd stops every generation of the edge when the test ends:
// they all stay in the first one's process group, so one signal stops
// whichever edge serves then.
func (u *upgradeEdge) stopGroupAtEnd(t *testing.T) {
	pgid := u.Cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := proc.Poll(ctx, "the edges to exit", func(context.Context) error {
			if err := syscall.Kill(-pgid, 0); err == nil {
				return errors.New("an edge of the group still runs")
			}
			return nil
		}); err != nil {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("--- edge output (last 60 lines) ---\n%s", u.logTail(60))
		}
	})
}

// output is everything the edges wrote so far.
func (u *upgradeEdge) output() string {
	b, _ := os.ReadFile(u.log)
	return string(b)
}

// logTail is the output's last n lines.
func (u *upgradeEdge) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(u.output(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logLines are the edge's JSON log lines with message msg, in order.
func (u *upgradeEdge) logLines(msg string) []map[string]any {
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(u.output()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			lines = append(lines, m)
		}
	}
	return lines
}

// waitLog waits until the log holds n lines with message msg and returns
// the nth.
func (u *upgradeEdge) waitLog(t *testing.T, msg string, n int, within time.Duration) map[string]any {
	t.Helper()
	var line map[string]any
	require.NoError(t, proc.Poll(testenv.Within(t, within), fmt.Sprintf("log line %d %q", n, msg), func(context.Context) error {
		if lines := u.logLines(msg); len(lines) >= n {
			line = lines[n-1]
			return nil
		}
		return errors.New("not logged yet")
	}), u.logTail(20))
	return line
}

// exited reports whether pid is gone (or a zombie nobody reaped yet).
func exited(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}

// loadCounts are one kind of client's results.
type loadCounts struct {
	ok, failed, refused atomic.Int64
	mu                  sync.Mutex
	firstErrs           []string
}

func (c *loadCounts) record(err error, code int) {
	switch {
	case err == nil && code == http.StatusOK:
		c.ok.Add(1)
		return
	case errors.Is(err, syscall.ECONNREFUSED):
		c.refused.Add(1)
	}
	c.failed.Add(1)
	c.mu.Lock()
	if len(c.firstErrs) < 5 {
		c.firstErrs = append(c.firstErrs, fmt.Sprintf("code %d err %v", code, err))
	}
	c.mu.Unlock()
}

// TestUpgradesLoseNoRequest: ten SIGUSR2 upgrades in a row under steady
// HTTP/1.1, TLS and HTTP/2 load, kept-alive and new connections alike:
// every request is answered 200, no connection is refused, and each
// upgrade really replaced the process (the new pid serves, the old exited).
func TestUpgradesLoseNoRequest(t *testing.T) {
	const upgrades = 10
	u := startUpgradeEdge(t)

	kinds := []struct {
		name string
		url  string
		tr   *http.Transport
	}{
		{"http1 keep-alive", "http://" + u.Addr + "/", &http.Transport{}},
		{"http1 new conns", "http://" + u.Addr + "/", &http.Transport{DisableKeepAlives: true}},
		{"tls http1", "https://" + u.tlsAddr + "/", &http.Transport{TLSClientConfig: u.pool.Clone(), TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}},
		{"http2", "https://" + u.tlsAddr + "/", &http.Transport{TLSClientConfig: u.pool.Clone(), ForceAttemptHTTP2: true}},
	}
	counts := make([]*loadCounts, len(kinds))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, k := range kinds {
		counts[i] = &loadCounts{}
		c := &http.Client{Transport: k.tr, Timeout: 10 * time.Second}
		t.Cleanup(k.tr.CloseIdleConnections)
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := c.Get(k.url)
					code := 0
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
						if err == nil && resp.ProtoMajor == 1 && k.name == "http2" {
							err = errors.New("HTTP/2 client answered over HTTP/1")
						}
					}
					counts[i].record(err, code)
				}
			})
		}
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	// Some load on the first edge before its first upgrade.
	waitServed := func(atLeast int64) {
		require.NoError(t, proc.Poll(testenv.Within(t, 10*time.Second), "every client served", func(context.Context) error {
			for i, c := range counts {
				if c.ok.Load() < atLeast {
					return fmt.Errorf("%s: %d answered", kinds[i].name, c.ok.Load())
				}
			}
			return nil
		}))
	}
	waitServed(5)
	pid := u.Cmd.Process.Pid
	for n := 1; n <= upgrades; n++ {
		before := make([]int64, len(counts))
		for i, c := range counts {
			before[i] = c.ok.Load()
		}
		require.NoError(t, syscall.Kill(pid, syscall.SIGUSR2))
		line := u.waitLog(t, "upgrade: the new edge is ready; this edge stops accepting and drains", n, 30*time.Second)
		newPID := int(line["new_pid"].(float64))
		require.NotEqual(t, pid, newPID)
		if err := proc.Poll(testenv.Within(t, 15*time.Second), fmt.Sprintf("edge %d to exit after upgrade %d", pid, n), func(context.Context) error {
			if !exited(pid) {
				return errors.New("still running")
			}
			return nil
		}); err != nil {
			// A goroutine dump in the log says what the edge waits for.
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			t.Fatal(err)
		}
		require.False(t, exited(newPID), "upgrade %d: the new edge %d is gone", n, newPID)
		serving := u.logLines("edge serving")
		require.Len(t, serving, n+1)
		require.Equal(t, float64(newPID), serving[n]["pid"], "upgrade %d: the edge serving is not the new process", n)
		// Every listener was handed over, none bound anew.
		var inherited []string
		for _, l := range u.logLines("listener inherited")[4*(n-1):] {
			inherited = append(inherited, l["listener"].(string))
		}
		require.ElementsMatch(t, []string{"public", "tls", "admin", "rls"}, inherited, "upgrade %d", n)
		c, err := net.DialTimeout("tcp", u.rlsAddr, 5*time.Second)
		require.NoError(t, err, "upgrade %d: the rate limit service's socket", n)
		require.NoError(t, c.Close())
		// Only the new process holds the sockets now: every kind of client
		// is answered by it.
		for i, c := range counts {
			require.NoError(t, proc.Poll(testenv.Within(t, 10*time.Second), kinds[i].name+" answered by the new edge", func(context.Context) error {
				if c.ok.Load() < before[i]+3 {
					return errors.New("not yet")
				}
				return nil
			}))
		}
		pid = newPID
	}
	stopLoad()
	var total int64
	for i, c := range counts {
		t.Logf("%-17s %6d answered 200, %d failed, %d refused", kinds[i].name, c.ok.Load(), c.failed.Load(), c.refused.Load())
		total += c.ok.Load()
	}
	for i, c := range counts {
		require.Zero(t, c.refused.Load(), "%s: refused connections: %v", kinds[i].name, c.firstErrs)
		require.Zero(t, c.failed.Load(), "%s: failed requests: %v", kinds[i].name, c.firstErrs)
	}
	t.Logf("%d upgrades, %d requests, 0 failed, 0 refused", upgrades, total)
}

// TestFailedUpgradeKeepsServing: a new binary that refuses its flags, or
// is no edge at all, leaves the running edge serving on the same sockets
// with the reason logged; the real binary put back then takes over.
func TestFailedUpgradeKeepsServing(t *testing.T) {
	u := startUpgradeEdge(t)
	real := u.bin + ".real"
	require.NoError(t, os.Link(u.bin, real))
	install := func(script string) {
		tmp := u.bin + ".new"
		require.NoError(t, os.WriteFile(tmp, []byte(script), 0o755))
		require.NoError(t, os.Rename(tmp, u.bin)) // as a package manager does: the running file is not written
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	pid := u.Cmd.Process.Pid
	for n, tc := range []struct{ name, script, why string }{
		{"bad flags", "#!/bin/sh\nexec " + real + " --no-such-flag \"$@\"\n", "exited before it was ready: exit status 2"},
		{"not an edge", "#!/bin/sh\necho crashing >&2\nexit 3\n", "exited before it was ready: exit status 3"},
	} {
		install(tc.script)
		require.NoError(t, syscall.Kill(pid, syscall.SIGUSR2))
		line := u.waitLog(t, "upgrade failed; this edge keeps serving", n+1, 30*time.Second)
		require.Contains(t, line["err"], tc.why, tc.name)
		require.True(t, u.Alive(), "%s: the running edge exited", tc.name)
		r := get(client, u.url("/"))
		require.NoError(t, r.err, tc.name)
		require.Equal(t, http.StatusOK, r.code, tc.name)
	}
	require.NoError(t, os.Rename(real, u.bin))
	require.NoError(t, syscall.Kill(pid, syscall.SIGUSR2))
	line := u.waitLog(t, "upgrade: the new edge is ready; this edge stops accepting and drains", 1, 30*time.Second)
	code, ok := u.WaitExit(15 * time.Second)
	require.True(t, ok, "the old edge did not exit after the upgrade")
	require.Zero(t, code)
	r := get(client, u.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)
	require.False(t, exited(int(line["new_pid"].(float64))))
}
