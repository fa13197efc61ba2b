package edge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// namedOrigin answers every request with its name, the Host it got and
// how many body bytes it read: which pool a request went to.
func namedOrigin(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s %d", name, r.Host, n)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// hostsTable is a table with pools a and b and their hosts.
func hostsTable(a, b, extra string) string {
	return fmt.Sprintf(`version: 1
pools:
  a:
    urls: [%q]
    max_request_body_size: 1000
  b:
    urls: [%q]
    max_request_body_size: 20971520
hosts:
  a.example: {pool: a}
  "*.b.example": {pool: b}
  plain.example: {pool: default}
%s`, a, b, extra)
}

// send makes one request for host through the edge and returns the status
// and body.
func send(t *testing.T, r *running, method, host string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+r.Addr()+"/", body)
	require.NoError(t, err)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// poolOf is the name of the origin that served host.
func poolOf(t *testing.T, r *running, host string) string {
	t.Helper()
	code, body := send(t, r, http.MethodGet, host, nil)
	require.Equal(t, http.StatusOK, code, "host %s: %s", host, body)
	name, _, _ := strings.Cut(body, " ")
	return name
}

// With --hosts, each host goes to its pool (exact names, wildcards, the
// rules' normalisation), the rest to --origin; SIGHUP re-reads the file,
// and an invalid file is refused with the table in force kept.
func TestHostsFileRoutesByHost(t *testing.T) {
	a, b, def := namedOrigin(t, "a"), namedOrigin(t, "b"), namedOrigin(t, "def")
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(hostsTable(a, b, "")), 0o600))
	r := startEdge(t, generous, func(c *config.Config) { c.Origins, c.Hosts = []string{def}, file })

	for host, want := range map[string]string{
		"a.example":       "a",
		"A.Example.":      "a", // as the rules normalise it
		"a.example:8080":  "a",
		"x.b.example":     "b",
		"y.x.b.example":   "b",
		"b.example":       "def", // a wildcard does not match its own suffix
		"plain.example":   "def",
		"other.example":   "def",
		"a.example.evil":  "def",
		"evil-a.example":  "def",
		"127.0.0.1":       "def",
		"xa.example":      "def",
		"a.example..":     "def",
		"x.b.example.com": "def",
	} {
		require.Equal(t, want, poolOf(t, r, host), "host %q", host)
	}
	// The origin gets the Host the client sent (no rewrite_host).
	_, body := send(t, r, http.MethodGet, "x.b.example", nil)
	require.Equal(t, "b x.b.example 0", body)
	require.Equal(t, 2.0, metricValue(t, r, "edgeguard_hosts_table_pools"))
	require.Equal(t, 3.0, metricValue(t, r, "edgeguard_hosts_table_hosts"))

	// Moved: a.example to b. The pool b is kept (same settings).
	require.NoError(t, os.WriteFile(file, []byte(strings.Replace(hostsTable(a, b, ""), "a.example: {pool: a}", "a.example: {pool: b}", 1)), 0o600))
	r.reloadFiles()
	require.Equal(t, "b", poolOf(t, r, "a.example"))

	// Invalid: refused, counted, the table in force kept.
	require.NoError(t, os.WriteFile(file, []byte(hostsTable(a, b, "  c.example: {pool: nowhere}\n")), 0o600))
	before := metricSum(t, r, "edgeguard_hosts_table_loads_total", "outcome", "error")
	r.reloadFiles()
	require.Equal(t, before+1, metricSum(t, r, "edgeguard_hosts_table_loads_total", "outcome", "error"))
	require.Equal(t, "b", poolOf(t, r, "a.example"))
	require.Equal(t, "def", poolOf(t, r, "c.example"))
}

// The request body cap is the host's pool's: a pool may take less than
// --max-body-bytes (413 before the origin sees anything, declared or
// chunked) or more (a body the default pool refuses passes).
func TestHostsBodyLimitPerPool(t *testing.T) {
	a, b, def := namedOrigin(t, "a"), namedOrigin(t, "b"), namedOrigin(t, "def")
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(hostsTable(a, b, "")), 0o600))
	r := startEdge(t, generous, func(c *config.Config) { c.Origins, c.Hosts = []string{def}, file })

	small := bytes.Repeat([]byte("x"), 2000)
	code, body := send(t, r, http.MethodPost, "a.example", bytes.NewReader(small))
	require.Equal(t, http.StatusRequestEntityTooLarge, code, body)
	require.Contains(t, body, "1000")
	// Chunked (no declared length): cut by the pool's cap as it streams.
	chunk := "200\r\n" + strings.Repeat("y", 0x200) + "\r\n"
	resp, rbody := raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n"+strings.Repeat(chunk, 4)+"0\r\n\r\n")
	requireProblem(t, resp, rbody, 413)
	// Announced with Expect: 100-continue: refused before the body is sent.
	resp, rbody = raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2000\r\nExpect: 100-continue\r\n\r\n")
	requireProblem(t, resp, rbody, 413)
	code, body = send(t, r, http.MethodPost, "a.example", bytes.NewReader(small[:1000]))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "a a.example 1000", body)
	code, body = send(t, r, http.MethodPost, "other.example", bytes.NewReader(small))
	require.Equal(t, http.StatusOK, code, body)

	// 12 MiB: above --max-body-bytes (10 MiB), within b's 20 MiB.
	big := bytes.Repeat([]byte("y"), 12<<20)
	// (Announced, so the client waits for the answer before sending 12 MiB.)
	resp, rbody = raw(t, r.Addr(), fmt.Sprintf("POST / HTTP/1.1\r\nHost: other.example\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", len(big)))
	requireProblem(t, resp, rbody, 413)
	code, body = send(t, r, http.MethodPost, "up.b.example", bytes.NewReader(big))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, fmt.Sprintf("b up.b.example %d", 12<<20), body)
}

// A declared body is judged by the pool of the host the request goes to:
// an absolute-form target's (RFC 9112 §3.2.2), not a Host field it
// overrides. Neither a larger pool's Host lets a body past a smaller
// pool's cap, nor a smaller pool's Host refuses one a larger pool takes,
// whether the body is sent or announced with Expect: 100-continue.
func TestHostsBodyLimitFollowsTheTarget(t *testing.T) {
	a, b, def := namedOrigin(t, "a"), namedOrigin(t, "b"), namedOrigin(t, "def")
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(hostsTable(a, b, "")), 0o600))
	r := startEdge(t, generous, func(c *config.Config) { c.Origins, c.Hosts = []string{def}, file })

	// (Raw requests: Go's client writes the Host it is given into an
	// absolute-form target too.)
	post := func(target, host string, n int) (*http.Response, []byte) {
		return raw(t, r.Addr(), fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", target, host, n, strings.Repeat("x", n)))
	}
	// 2000 bytes: over a's 1000, within b's 20 MiB.
	resp, body := post("http://a.example/", "up.b.example", 2000)
	require.Contains(t, requireProblem(t, resp, body, http.StatusRequestEntityTooLarge).Detail, "1000", "a's cap")
	resp, body = raw(t, r.Addr(), "POST http://a.example/ HTTP/1.1\r\nHost: up.b.example\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
	require.Contains(t, requireProblem(t, resp, body, http.StatusRequestEntityTooLarge).Detail, "1000", "a's cap")

	resp, body = post("http://up.b.example/", "a.example", 2000)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "b up.b.example 2000", string(body))
	resp, body = post("http://a.example/", "up.b.example", 1000)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "a a.example 1000", string(body))
}

// From Consul: the region's table is applied before the first request and
// changes live; a deleted table is missing (the one in force stays); a
// restart with Consul gone serves the cached table.
func TestHostsFromConsulLive(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	a, b, def := namedOrigin(t, "a"), namedOrigin(t, "b"), namedOrigin(t, "def")
	key := rc.Layout().Hosts("eu-west")
	pushHosts := func(doc string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, idx, err := rc.Get(ctx, "eu-west", key)
		require.NoError(t, err)
		_, err = rc.Push(ctx, "eu-west", key, []byte(doc), idx, region.Entry{Kind: region.KindHosts, Author: "test"})
		require.NoError(t, err)
		tab, err := hosts.Parse([]byte(doc))
		require.NoError(t, err)
		return tab.Version()
	}
	waitHosts := func(r *running, want string) {
		t.Helper()
		require.NoError(t, proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, "the edge to run host table "+want, func(context.Context) error {
			if v := r.origins.Router.Version(); v != want {
				return fmt.Errorf("it runs %q", v)
			}
			return nil
		}))
	}
	v1 := pushHosts(hostsTable(a, b, ""))
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	r := startConsulEdge(t, "eu-west", "pop1", c.HTTPAddr(), cache, func(cfg *config.Config) { cfg.Origins = []string{def} })
	require.Equal(t, v1, r.origins.Router.Version(), "applied before the first request")
	require.Equal(t, "a", poolOf(t, r, "a.example"))

	v2 := pushHosts(strings.Replace(hostsTable(a, b, ""), "a.example: {pool: a}", "a.example: {pool: b}", 1))
	waitHosts(r, v2)
	require.Equal(t, "b", poolOf(t, r, "a.example"))

	// Deleted: missing, kept.
	_, err = rc.API().KV().Delete(key, nil)
	require.NoError(t, err)
	require.NoError(t, proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, "the host table counted missing", func(context.Context) error {
		if v := metricSum(t, r, "edgeguard_edge_consul_documents_missing", "document", "hosts"); v != 1 {
			return fmt.Errorf("missing gauge %v", v)
		}
		return nil
	}))
	require.Equal(t, v2, r.origins.Router.Version())
	require.Equal(t, "b", poolOf(t, r, "a.example"))
	r.stop()

	// Consul gone: the next edge serves the cached table.
	c.Close()
	r2 := startConsulEdge(t, "eu-west", "pop1", c.HTTPAddr(), cache, func(cfg *config.Config) { cfg.Origins = []string{def} })
	require.Equal(t, v2, r2.origins.Router.Version())
	require.Equal(t, "b", poolOf(t, r2, "a.example"))
	require.Equal(t, "def", poolOf(t, r2, "other.example"))
}
