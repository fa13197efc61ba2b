package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

const problemAbnormalUsage = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"

// behaviourEdges starts 3 edges on the shared Cluster with rules (a
// behaviour section and opted-in rules), trusting the test as a proxy so
// X-Forwarded-For picks the client. The first two edges batch their Redis
// calls (the default), the third sends plain pipelines
// (--redis-autopipeline=false), so signal updates ride both ways.
func behaviourEdges(t *testing.T, rules string) []*edgeProc {
	t.Helper()
	org := startOrigin(t, 0)
	path := writeRules(t, rules)
	// The store deadline is not these tests' subject: each asserts the
	// limits Redis decides (remaining counts, a 200 after the cool-down),
	// and a call past the 250 ms default on a busy host would be decided
	// by the fallback instead: a denial, since Redis has not failed
	// this edge for a whole window (docs/guarantees.md, "Exact rules in
	// the fallback").
	args := []string{"--origin", org.URL, "--rules", path,
		"--redis", cluster.URL(), "--redis-mode", "cluster", "--redis-timeout", "5s",
		"--trusted-proxies", "127.0.0.1", "--key-salt", testenv.KeyPrefix(t), "--nodes-in-region", "3"}
	return []*edgeProc{
		startEdge(t, args...),
		startEdge(t, args...),
		startEdge(t, append(args, "--redis-autopipeline=false")...),
	}
}

var remainingField = regexp.MustCompile(`"([^"]+)";r=(\d+);t=(\d+)`)

// remaining is r of the RateLimit field's first item (-1: none).
func remaining(r reply) int {
	m := remainingField.FindStringSubmatch(r.header.Get("RateLimit"))
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[2])
	return n
}

// debugClient is /debug/clients of an edge for a client address.
type debugClient struct {
	Mode   string `json:"mode"`
	Known  bool   `json:"known"`
	Client struct {
		ID     string `json:"id"`
		Level  string `json:"level"`
		Region struct {
			Level  string `json:"level"`
			Replay int64  `json:"replay"`
			Scan   int64  `json:"scan"`
			Denial int64  `json:"denial"`
		} `json:"region"`
	} `json:"client"`
}

func clientState(t *testing.T, e *edgeProc, ip string) debugClient {
	t.Helper()
	r := get(&http.Client{Timeout: 5 * time.Second}, "http://"+e.Admin+"/debug/clients?ip="+ip, "Authorization", "Bearer "+adminToken)
	require.NoError(t, r.err)
	var d debugClient
	require.NoError(t, json.Unmarshal(r.body, &d), "%s", r.body)
	return d
}

const scanRules = `
version: 1
behaviour:
  mode: %s
rules:
  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 1000, window: 1m, behaviour: true}
`

// TestScannerAcrossThreeEdges: a client touching 300 distinct paths, its
// requests spread round-robin over 3 edges, is judged suspicious within 60
// requests with the default weights (its limit tightens to 0.1×: the
// RateLimit field's r drops below 100 while RateLimit-Policy keeps q=1000),
// because its signals add up region-wide in Redis; no edge alone sees
// enough (a third of the paths each).
func TestScannerAcrossThreeEdges(t *testing.T) {
	es := behaviourEdges(t, fmt.Sprintf(scanRules, "enforce"))
	c := newClient(t, 2)
	const ip = "198.51.100.10"
	first := 0
	for i := range 300 {
		r := get(c, es[i%3].url(fmt.Sprintf("/scan/%d", i)), "X-Forwarded-For", ip)
		require.NoError(t, r.err)
		require.Equal(t, `"per-ip";q=1000;w=60`, r.header.Get("RateLimit-Policy"), "the static quota is kept")
		if r.code == http.StatusOK && remaining(r) < 100 {
			first = i + 1
			break
		}
	}
	t.Logf("suspicious (limit 1000 → 100) from request %d", first)
	require.NotZero(t, first, "never tightened to the suspicious level")
	require.LessOrEqual(t, first, 60)
	// The region's reading says so on every edge that judged the client.
	d := clientState(t, es[(first-1)%3], ip)
	require.Equal(t, "suspicious", d.Client.Level)
	require.GreaterOrEqual(t, d.Client.Region.Scan, int64(45))
	var changes float64
	for _, e := range es {
		changes += sum(scrape(t, e), "edgeguard_behaviour_level_changes_total", "to", "suspicious", "mode", "enforce")
	}
	require.Positive(t, changes)
}

// TestShadowChangesNoResponse: the same scanner in shadow mode gets every
// answer it would get without the layer (the limit is never tightened),
// while the edges count the level changes.
func TestShadowChangesNoResponse(t *testing.T) {
	es := behaviourEdges(t, fmt.Sprintf(scanRules, "shadow"))
	c := newClient(t, 2)
	for i := range 120 {
		r := get(c, es[i%3].url(fmt.Sprintf("/scan/%d", i)), "X-Forwarded-For", "198.51.100.11")
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.code)
		require.Equal(t, 1000-(i+1), remaining(r), "request %d: the limit as without the layer", i+1)
	}
	var changes float64
	for _, e := range es {
		m := scrape(t, e)
		changes += sum(m, "edgeguard_behaviour_level_changes_total", "to", "suspicious", "mode", "shadow")
		changes += sum(m, "edgeguard_behaviour_level_changes_total", "to", "blocked", "mode", "shadow")
		require.Zero(t, sum(m, "edgeguard_behaviour_actions_total"), "shadow acts on nothing")
	}
	require.Positive(t, changes, "level changes are counted in shadow mode")
}

// TestDenialLoopBlocksThenCoolsDown: a client that keeps sending after
// its 429s reaches blocked (429, abnormal-usage-detected, Retry-After = the
// cool-down), and once it has waited the cool-down it is normal again: its
// next request is admitted under the rule's full limit.
//
// Parallel: its edges are its own (the shared Cluster under its own key
// salt), and most of its time is the cool-down on the clock.
func TestDenialLoopBlocksThenCoolsDown(t *testing.T) {
	t.Parallel()
	es := behaviourEdges(t, `
version: 1
behaviour:
  mode: enforce
  horizon: 4s
  burst_window: 2s
  cooldown: 5s
rules:
  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 10, window: 2s, behaviour: true}
`)
	c := newClient(t, 2)
	const ip = "198.51.100.12"
	var blockedAt int
	var last reply
	quota := 0
	start := time.Now()
	for i := range 200 {
		last = get(c, es[i%3].url("/api/orders?page="+strconv.Itoa(i)), "X-Forwarded-For", ip)
		require.NoError(t, last.err)
		if last.code == http.StatusTooManyRequests {
			var p problem
			require.NoError(t, json.Unmarshal(last.body, &p))
			if p.Type == problemAbnormalUsage {
				blockedAt = i + 1
				break
			}
			quota++
		}
		time.Sleep(20 * time.Millisecond) // kept: a client looping at ~50 requests/s, whatever it is told
	}
	t.Logf("blocked at request %d, after %d quota-exceeded answers", blockedAt, quota)
	require.NotZero(t, blockedAt, "never blocked")
	require.Positive(t, quota, "the loop was over 429s")
	require.Equal(t, "5", last.header.Get("Retry-After"), "Retry-After is the cool-down")
	require.Empty(t, last.header.Get("RateLimit"), "the level is not disclosed")
	d := clientState(t, es[(blockedAt-1)%3], ip)
	require.Equal(t, "blocked", d.Client.Level)
	require.Positive(t, d.Client.Region.Denial, "requests before Retry-After counted")
	// The 429s and the requests the over-limit cache denied reached Redis
	// in flushes, each edge at most one per 100 ms.
	elapsed := time.Since(start)
	var flushed float64
	for _, e := range es {
		f := sum(scrape(t, e), "edgeguard_behaviour_flushes_total")
		require.LessOrEqual(t, f, float64(elapsed/(100*time.Millisecond))+1)
		flushed += f
	}
	require.Positive(t, flushed)

	// The client now obeys Retry-After (the behaviour under test is what
	// happens after that wait), then comes back.
	time.Sleep(6 * time.Second) // kept: Retry-After said 5; the cool-down runs on the clock
	r := get(c, es[0].url("/api/orders"), "X-Forwarded-For", ip)
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code, "%s", r.body)
	require.Equal(t, 9, remaining(r), "the full limit again: normal")
	require.Eventually(t, func() bool { return clientState(t, es[0], ip).Client.Level == "normal" }, 5*time.Second, 50*time.Millisecond)
}

// TestReplayDetected: 20 identical requests (spread over the 3 edges) are
// detected as a replay; 20 requests that differ only in their query are not.
func TestReplayDetected(t *testing.T) {
	es := behaviourEdges(t, fmt.Sprintf(scanRules, "enforce"))
	c := newClient(t, 2)
	const replayer, browser = "198.51.100.13", "198.51.100.14"
	for i := range 20 {
		r := get(c, es[i%3].url("/item?id=7"), "X-Forwarded-For", replayer)
		require.NoError(t, r.err)
		r = get(c, es[i%3].url("/item?id="+strconv.Itoa(i)), "X-Forwarded-For", browser)
		require.NoError(t, r.err)
		require.Equal(t, 1000-(i+1), remaining(r), "the distinct client's limit is never tightened")
	}
	// The last request's reply is the region's reading on edge 19%3.
	e := es[19%3]
	require.Eventually(t, func() bool { return clientState(t, e, replayer).Client.Region.Replay == 19 }, 5*time.Second, 20*time.Millisecond)
	rep := clientState(t, e, replayer)
	require.NotEqual(t, "normal", rep.Client.Level, "%+v", rep)
	br := clientState(t, e, browser)
	require.Equal(t, "normal", br.Client.Level, "%+v", br)
	require.Zero(t, br.Client.Region.Replay)
}

const keyedScanRules = `
version: 1
behaviour:
  mode: enforce
rules:
  - {id: per-key, key: ["header:X-Api-Key"], algorithm: sliding_log, limit: 1000, window: 1m, behaviour: true}
`

// TestRotatingKeysDoNotHideAScanner: a scanner that sends a fresh API key
// with every request is still scored, by its address: a key the edge did
// not see authenticated is not an identity.
func TestRotatingKeysDoNotHideAScanner(t *testing.T) {
	es := behaviourEdges(t, keyedScanRules)
	c := newClient(t, 2)
	const ip = "198.51.100.30"
	first := 0
	for i := range 200 {
		r := get(c, es[i%3].url(fmt.Sprintf("/scan/%d", i)), "X-Forwarded-For", ip, "X-Api-Key", fmt.Sprintf("rotated-%d", i))
		require.NoError(t, r.err)
		if r.code == http.StatusOK && remaining(r) < 100 {
			first = i + 1
			break
		}
	}
	t.Logf("a key-rotating scanner tightened (limit 1000 → 100) from request %d", first)
	require.NotZero(t, first, "rotating keys kept the scanner unscored")
	d := clientState(t, es[(first-1)%3], ip)
	require.Equal(t, "suspicious", d.Client.Level)
}

// TestBorrowedKeyDoesNotBlockItsOwner: a scanner sending a victim's API key
// until it is blocked never gets the victim, who calls from elsewhere with
// the same key, answered abnormal-usage-detected.
func TestBorrowedKeyDoesNotBlockItsOwner(t *testing.T) {
	es := behaviourEdges(t, keyedScanRules)
	c := newClient(t, 2)
	const scanner, victim, key = "198.51.100.31", "203.0.113.31", "victims-key"
	blocked := false
	var judge *edgeProc  // the edge that blocked it
	for i := range 600 { // scanning, then hammering through its 429s
		r := get(c, es[i%3].url(fmt.Sprintf("/scan/%d", i)), "X-Forwarded-For", scanner, "X-Api-Key", key)
		require.NoError(t, r.err)
		var p problem
		if r.code == http.StatusTooManyRequests && json.Unmarshal(r.body, &p) == nil && p.Type == problemAbnormalUsage {
			blocked, judge = true, es[i%3]
			break
		}
	}
	require.True(t, blocked, "the scanner was never blocked")
	for i := range 6 {
		r := get(c, es[i%3].url("/api/orders"), "X-Forwarded-For", victim, "X-Api-Key", key)
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.code, "the key's owner got %d: %s", r.code, r.body)
	}
	require.Equal(t, "blocked", clientState(t, judge, scanner).Client.Level)
}
