package edge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// trust127 makes the test client (127.0.0.1) a trusted proxy.
func trust127(t *testing.T) func(*config.Config) {
	return func(c *config.Config) { c.TrustedProxies = append(c.TrustedProxies, mustPrefix("127.0.0.1/32")) }
}

// withRedis points an edge at rd with keys of its own (salt).
func withRedis(rd *testenv.Standalone, salt string, more ...func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		c.Redis, c.RedisTimeout, c.KeySalt = rd.URL(), time.Second, salt
		for _, f := range more {
			f(c)
		}
	}
}

// flood sends n requests for / from 8 goroutines and counts the statuses.
func flood(t *testing.T, r *running, n int, headers ...string) map[int]int {
	return floodPath(t, r, "/", n, headers...)
}

// floodPath sends n requests for path from 8 goroutines and counts the
// statuses.
func floodPath(t *testing.T, r *running, path string, n int, headers ...string) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range 8 {
		wg.Go(func() {
			for range next {
				req, err := http.NewRequest(http.MethodGet, "http://"+r.Addr()+path, nil)
				if err != nil {
					panic(err)
				}
				for i := 0; i+1 < len(headers); i += 2 {
					req.Header.Set(headers[i], headers[i+1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					panic(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				got[resp.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// bypassRules limits per IP and lets a network and a partner's API key
// through.
var bypassRules = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_window
    limit: 3
    window: 1m
    metrics: true
    bypass:
      cidrs: [10.1.0.0/16]
      api_key_header: X-Api-Key
      api_key_sha256: [` + sha256Hex("partner-key") + `]
`

// TestEscapes runs each escape against one real Redis.
func TestEscapes(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer rd.Close()

	t.Run("bypass CIDR under a flood", func(t *testing.T) { escapesBypassCIDR(t, rd) })
	t.Run("a spoofed forwarding header bypasses nothing", func(t *testing.T) { escapesSpoofedHeader(t, rd) })
	t.Run("bypass by API key hash", func(t *testing.T) { escapesBypassAPIKey(t, rd) })
	t.Run(fmt.Sprintf("override of 1 of %d keys", overrideKeys), func(t *testing.T) { escapesOverride(t, rd) })
	t.Run("limit header only from trusted peers", func(t *testing.T) { escapesLimitHeader(t, rd) })
	t.Run("penalty outlives the window, region-wide", func(t *testing.T) { escapesPenalty(t, rd) })
}

// escapesBypassCIDR: a flood from the allowlisted network is never
// limited; its neighbour is.
func escapesBypassCIDR(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, bypassRules, withRedis(rd, testenv.KeyPrefix(t), trust127(t)))
	got := flood(t, r, 300, "X-Forwarded-For", "10.1.2.3")
	require.Equal(t, map[int]int{200: 300}, got, "the allowlisted network is never limited")
	got = flood(t, r, 50, "X-Forwarded-For", "192.0.2.9")
	require.Equal(t, map[int]int{200: 3, 429: 47}, got, "its neighbour is")
	require.Equal(t, 300.0, metricSum(t, r, "edgeguard_edge_decisions_total", "rule", "per-ip", "decision", "bypass"))
	require.Equal(t, 300.0, escapeCount(t, r, "per-ip", "bypass"))
}

// escapesSpoofedHeader: from an untrusted peer, a forwarding header naming
// the allowlisted network bypasses nothing.
func escapesSpoofedHeader(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, bypassRules, withRedis(rd, testenv.KeyPrefix(t))) // 127.0.0.1 untrusted
	got := flood(t, r, 20, "X-Forwarded-For", "10.1.2.3")
	require.Equal(t, map[int]int{200: 3, 429: 17}, got)
	require.Zero(t, escapeCount(t, r, "per-ip", "bypass"))
}

// escapesBypassAPIKey: the partner's key bypasses; its hash does not.
func escapesBypassAPIKey(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, bypassRules, withRedis(rd, testenv.KeyPrefix(t)))
	require.Equal(t, []int{200, 200, 200, 200, 200}, codes(t, r, 5, "/", "X-Api-Key", "partner-key"))
	// The hash is not a key: sending it is sending some other key.
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/", "X-Api-Key", sha256Hex("partner-key")))
}

// escapesOverride: one key of overrideKeys (100,000; 10,000 under the race
// detector) has its own limit; a key without one has the rule's.
func escapesOverride(t *testing.T, rd *testenv.Standalone) {
	var doc strings.Builder
	doc.WriteString("version: 1\nrules:\n  - id: per-user\n    key: [header:X-User]\n    algorithm: token_bucket\n    limit: 2\n    window: 1m\n    metrics: true\n    overrides:\n")
	for i := range overrideKeys {
		fmt.Fprintf(&doc, "      - {key: [u%d], limit: %d}\n", i, 10+i%7)
	}
	r := startEdge(t, doc.String(), withRedis(rd, testenv.KeyPrefix(t)))
	k := overrideKeys * 54321 / 100_000 // u54321 at 100,000
	own := 10 + k%7
	got := codes(t, r, own+1, "/", "X-User", fmt.Sprintf("u%d", k))
	require.Equal(t, append(repeatInt(200, own), 429), got, "u%d has its own limit", k)
	require.Equal(t, []int{200, 200, 429}, codes(t, r, 3, "/", "X-User", "stranger"), "no override: the rule's limit")
	require.Equal(t, float64(own+1), escapeCount(t, r, "per-user", "override"))
}

// escapesLimitHeader: the limit header applies only from trusted peers;
// garbage in it is ignored and counted.
func escapesLimitHeader(t *testing.T, rd *testenv.Standalone) {
	rulesYAML := `
version: 1
rules:
  - id: plan
    key: [header:X-User]
    algorithm: fixed_window
    limit: 2
    window: 1h
    metrics: true
    limit_header: X-Edge-Limit
`
	trusted := startEdge(t, rulesYAML, withRedis(rd, testenv.KeyPrefix(t), trust127(t)))
	// Every count below lives in one hour's window.
	testenv.EarlyInWindow(time.Hour, 20*time.Second)
	require.Equal(t, []int{200, 200, 200, 200, 200, 429}, codes(t, trusted, 6, "/", "X-User", "a", "X-Edge-Limit", "5"))
	// Garbage is ignored (the rule's limit holds) and counted.
	for _, v := range []string{"-5", "NaN", "1e9", "99999999999999999999"} {
		require.Equal(t, []int{200, 200, 429}, codes(t, trusted, 3, "/", "X-User", "bad"+v, "X-Edge-Limit", v), v)
	}
	require.Equal(t, 12.0, escapeCount(t, trusted, "plan", "limit_header_ignored"))

	untrusted := startEdge(t, rulesYAML, withRedis(rd, testenv.KeyPrefix(t)))
	require.Equal(t, []int{200, 200, 429}, codes(t, untrusted, 3, "/", "X-User", "a", "X-Edge-Limit", "1000"), "a client cannot raise its own limit")
	require.Equal(t, 3.0, escapeCount(t, untrusted, "plan", "limit_header_ignored"))
	require.Zero(t, escapeCount(t, untrusted, "plan", "limit_header"))
}

// escapesPenalty: a penalty outlives the rule's window, on every edge of
// the region.
func escapesPenalty(t *testing.T, rd *testenv.Standalone) {
	rulesYAML := `
version: 1
rules:
  - id: login
    key: [ip]
    algorithm: fixed_window
    limit: 2
    window: 1s
    metrics: true
    penalty: 3s
`
	salt := testenv.KeyPrefix(t)
	a := startEdge(t, rulesYAML, withRedis(rd, salt))
	b := startEdge(t, rulesYAML, withRedis(rd, salt)) // another edge of the region
	var tripped time.Time
	for tripped.IsZero() {
		resp := a.get(t, "/")
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode == 429 {
			tripped = time.Now()
			require.Equal(t, "3", resp.Header.Get("Retry-After"), "the penalty, not the window, says when")
		}
	}
	// The other edge denies too, before counting, with the time left.
	resp := b.get(t, "/")
	require.Equal(t, 429, resp.StatusCode)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.True(t, retry >= 1 && retry <= 3, "Retry-After %d", retry)
	require.Equal(t, 1.0, metricSum(t, b, "edgeguard_edge_decisions_total", "rule", "login", "decision", "denied", "reason", "penalty"))

	// Keep knocking, slowly (well under the rule's rate): denied until
	// the penalty ends, however many windows pass.
	var freed time.Time
	for freed.IsZero() {
		resp := a.get(t, "/")
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode == 200 {
			freed = time.Now()
			continue
		}
		require.Less(t, time.Since(tripped), 20*time.Second, "the penalty never ended")
		time.Sleep(250 * time.Millisecond) // kept: the client's pace, not a wait for a signal
	}
	require.GreaterOrEqual(t, freed.Sub(tripped), 2900*time.Millisecond, "denied for the whole penalty, 3 windows of the rule")
	require.GreaterOrEqual(t, escapeCount(t, a, "login", "penalised"), 5.0)
	require.Equal(t, 1.0, escapeCount(t, a, "login", "penalty_start"))
}

// escapeCount is edgeguard_edge_escapes_total of a rule and escape.
func escapeCount(t *testing.T, r *running, rule, escape string) float64 {
	return metricSum(t, r, "edgeguard_edge_escapes_total", "rule", rule, "escape", escape)
}

// TestCountByResponse: rules that count only what the origin's response
// says, against a real Redis.
func TestCountByResponse(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer rd.Close()

	t.Run("only 401s count: credential stuffing", func(t *testing.T) { countOnly401s(t, rd) })
	t.Run("a credential-stuffing flood overshoots by what is in flight", func(t *testing.T) { countFloodOvershoot(t, rd) })
	t.Run("cost from a response header, bounded", func(t *testing.T) { countCostHeader(t, rd) })
}

// waitCounted waits until n responses have been counted (the count is
// sent after the response, on its own goroutine).
func waitCounted(t *testing.T, r *running, rule string, n float64) {
	t.Helper()
	what := fmt.Sprintf("%v responses of %s counted", n, rule)
	err := proc.PollEvery(testenv.Within(t, 10*time.Second), 5*time.Millisecond, what, func(context.Context) error {
		if got := escapeCount(t, r, rule, "response_counted"); got < n {
			return fmt.Errorf("%v counted", got)
		}
		return nil
	})
	require.NoError(t, err)
}

// countOnly401s: only 401s count (credential stuffing); once they are
// over the limit, every request of the client is denied.
func countOnly401s(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, `
version: 1
rules:
  - id: stuffing
    key: [ip]
    algorithm: sliding_window
    limit: 5
    window: 1m
    metrics: true
    count_if: {status: [401]}
`, withRedis(rd, testenv.KeyPrefix(t)))
	require.Equal(t, repeatInt(200, 20), codes(t, r, 20, "/status?code=200"), "successes are not counted")
	for i := range 6 {
		require.Equal(t, []int{401}, codes(t, r, 1, "/status?code=401"), "attempt %d reaches the origin", i)
		waitCounted(t, r, "stuffing", float64(i+1))
	}
	// The sixth 401 did not fit: the key is blocked until a unit
	// frees, for every request of the client.
	resp := r.get(t, "/status?code=200")
	require.Equal(t, 429, resp.StatusCode)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	// A sliding window frees a unit as the previous window's count
	// decays: up to two windows after the counts were made.
	require.True(t, retry > 1 && retry <= 120, "Retry-After %d: until the window frees a unit", retry)
	require.Equal(t, 1.0, escapeCount(t, r, "stuffing", "response_blocked"))
	require.Equal(t, 5.0, metricSum(t, r, "edgeguard_edge_decisions_total", "rule", "stuffing", "decision", "allowed"))
}

// countFloodOvershoot: a credential-stuffing flood overshoots the limit by
// what is in flight, and no more.
func countFloodOvershoot(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, `
version: 1
rules:
  - id: stuffing
    key: [ip]
    algorithm: sliding_window
    limit: 20
    window: 1m
    metrics: true
    count_if: {status: [401, 403]}
`, withRedis(rd, testenv.KeyPrefix(t)))
	got := floodPath(t, r, "/status?code=401", 400)
	t.Logf("400 attempts, 8 at a time, limit 20: %d reached the origin (overshoot %d), %d denied", got[401], got[401]-20, got[429])
	require.Equal(t, 400, got[401]+got[429])
	require.GreaterOrEqual(t, got[401], 20)
	// Overshoot: the requests in flight when the count crossed, and
	// those sent before that count's reply set the block; bounded here
	// with a wide margin for a loaded machine.
	require.Less(t, got[401], 20+8*10)
}

// countCostHeader: the cost comes from a response header, bounded by the
// capacity; garbage costs the rule's cost.
func countCostHeader(t *testing.T, rd *testenv.Standalone) {
	r := startEdge(t, `
version: 1
rules:
  - id: complexity
    key: [header:X-User]
    algorithm: fixed_window
    limit: 10
    window: 1h
    metrics: true
    cost_header: X-Cost
`, withRedis(rd, testenv.KeyPrefix(t)))
	// Every step counts on one window's units.
	testenv.EarlyInWindow(time.Hour, 20*time.Second)
	for i, c := range []string{"4", "4"} {
		require.Equal(t, []int{200}, codes(t, r, 1, "/status?code=200&cost="+c, "X-User", "a"))
		waitCounted(t, r, "complexity", float64(i+1))
	}
	// 8 of 10 taken: a cost of 4 does not fit, and blocks the key.
	require.Equal(t, []int{200}, codes(t, r, 1, "/status?code=200&cost=4", "X-User", "a"))
	waitCounted(t, r, "complexity", 3)
	require.Equal(t, []int{429}, codes(t, r, 1, "/status?code=200&cost=1", "X-User", "a"))

	// A huge cost is charged max_cost (the capacity: 10), and blocks;
	// garbage is charged the rule's cost (1). Each is an error.
	require.Equal(t, []int{200}, codes(t, r, 1, "/status?code=200&cost=99999999999999999999999", "X-User", "huge"))
	waitCounted(t, r, "complexity", 4)
	require.Equal(t, []int{200}, codes(t, r, 1, "/status?code=200&cost=1", "X-User", "huge"))
	waitCounted(t, r, "complexity", 5)
	require.Equal(t, []int{429}, codes(t, r, 1, "/status?code=200", "X-User", "huge"), "10 of 10 taken by one response")
	for i, c := range []string{"-5", "NaN", "1e3"} {
		require.Equal(t, []int{200}, codes(t, r, 1, "/status?code=200&cost="+c, "X-User", "garbage"))
		waitCounted(t, r, "complexity", float64(6+i))
	}
	require.Equal(t, 4.0, escapeCount(t, r, "complexity", "cost_header_error"))
	// 3 units taken by the 3 bad headers, 7 left: 7 responses fit, the
	// next one (already served when it is counted) does not and blocks.
	require.Equal(t, repeatInt(200, 8), codes(t, r, 8, "/status?code=200", "X-User", "garbage"))
	waitCounted(t, r, "complexity", 16)
	require.Equal(t, []int{429}, codes(t, r, 1, "/status?code=200", "X-User", "garbage"))
}

// TestEscapesThroughConsul: escapes pushed to a region's Consul reach a
// running edge (validated, swapped live) and apply against Redis; a push
// that drops the bypass limits the same traffic.
func TestEscapesThroughConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer rd.Close()
	rc := regionClient(t, c)
	doc := func(bypass string) string {
		return `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 2
    window: 1h
    penalty: 1m
    metrics: true` + bypass + "\n"
	}
	withBypass := doc(`
    bypass:
      cidrs: [127.0.0.0/8]`)
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), withBypass)
	r := startEdge(t, "version: 1\nrules: []\n", withRedis(rd, testenv.KeyPrefix(t), func(cfg *config.Config) {
		cfg.Rules, cfg.Consul, cfg.RulesCache = "", c.HTTPAddr(), filepath.Join(t.TempDir(), "cache.yaml")
		cfg.Region, cfg.PoP = "eu-west", "ams"
	}))
	waitVersion(t, r, effectiveVersion(t, withBypass, ""), time.Now())
	require.Equal(t, repeatInt(200, 20), codes(t, r, 20, "/"), "loopback is allowlisted")
	require.Equal(t, 20.0, escapeCount(t, r, "per-ip", "bypass"))

	without := doc("")
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), without)
	waitVersion(t, r, effectiveVersion(t, without, ""), time.Now())
	testenv.EarlyInWindow(time.Hour, 20*time.Second) // the four in one window
	require.Equal(t, []int{200, 200, 429, 429}, codes(t, r, 4, "/"), "limited, then penalised")
	require.Equal(t, 1.0, escapeCount(t, r, "per-ip", "penalty_start"))
	require.Equal(t, 1.0, escapeCount(t, r, "per-ip", "penalised"))
}

// commandCalls is how many times Redis ran each of cmds (INFO commandstats).
// countedRedis starts a Redis of the test's own, and a client to read its
// command counts (commandCalls) with.
func countedRedis(t *testing.T) (*testenv.Standalone, *redis.Client) {
	t.Helper()
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })
	opts, err := redis.ParseURL(rd.URL())
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return rd, c
}

func commandCalls(t *testing.T, c *redis.Client, cmds ...string) []int {
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := make([]int, len(cmds))
	for i, cmd := range cmds {
		_, rest, ok := strings.Cut(info, "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		out[i], err = strconv.Atoi(n)
		require.NoError(t, err)
	}
	return out
}

// TestPenaltyRedisCost measures what a penalty rule asks of Redis: one
// PTTL per request while the key is free, nothing while this edge knows
// it is penalised, one SET per penalty started.
func TestPenaltyRedisCost(t *testing.T) {
	rd, c := countedRedis(t)
	r := startEdge(t, `
version: 1
rules:
  - id: login
    key: [ip]
    algorithm: fixed_window
    limit: 50
    window: 1h
    penalty: 1m
`, withRedis(rd, testenv.KeyPrefix(t)))
	testenv.EarlyInWindow(time.Hour, 20*time.Second) // the 52 in one window
	before := commandCalls(t, c, "pttl", "set")
	require.Equal(t, repeatInt(200, 50), codes(t, r, 50, "/"))
	free := commandCalls(t, c, "pttl", "set")
	start := tallied(t, c) // the edge's first takes, before it knew who serves the key
	require.Equal(t, []int{429, 429}, codes(t, r, 2, "/"), "the 51st starts the penalty, the 52nd serves it")
	started := commandCalls(t, c, "pttl", "set")
	require.Equal(t, repeatInt(429, 100), codes(t, r, 100, "/"))
	served := commandCalls(t, c, "pttl", "set")
	t.Logf("PTTL, SET: 50 free requests %d (%d of them for the tallies of the first takes), %d; the trip %d, %d; 100 penalised %d, %d",
		free[0]-before[0], start, free[1]-before[1], started[0]-free[0], started[1]-free[1], served[0]-started[0], served[1]-started[1])
	require.Equal(t, 50, free[0]-before[0]-start, "one PTTL per request of a free key")
	require.Less(t, start, 50, "takes made once the edge knows who serves the key are not tallied")
	require.Equal(t, start, tallied(t, c), "nor are the takes after the free ones")
	require.Equal(t, 1, started[0]-free[0], "the tripping request looked first; the next one is known here")
	require.Equal(t, 1, started[1]-free[1], "one SET per penalty started")
	require.Equal(t, 0, served[0]-started[0], "a penalised flood costs Redis nothing")
}

// What counting by the response costs Redis, from Redis's own command
// counts: one PTTL per request (is the key blocked?), and one script call
// per counted response (fewer when concurrent counts share a batch);
// responses that do not match cost no script call.
func TestCountByResponseRedisCost(t *testing.T) {
	rd, c := countedRedis(t)
	r := startEdge(t, `
version: 1
rules:
  - id: stuffing
    key: [ip]
    algorithm: fixed_window
    limit: 1000
    window: 1m
    metrics: true
    count_if: {status: [401]}
`, withRedis(rd, testenv.KeyPrefix(t)))
	testenv.EarlyInWindow(time.Minute, 10*time.Second) // the tallies, which end with their window, read in it
	cmds := []string{"pttl", "evalsha", "eval"}
	before := commandCalls(t, c, cmds...)
	require.Equal(t, repeatInt(200, 50), codes(t, r, 50, "/status?code=200"))
	ok := commandCalls(t, c, cmds...)
	require.Equal(t, repeatInt(401, 20), codes(t, r, 20, "/status?code=401"))
	require.Eventually(t, func() bool { return escapeCount(t, r, "stuffing", "response_counted") >= 20 },
		10*time.Second, 5*time.Millisecond)
	counted := commandCalls(t, c, cmds...)
	start := tallied(t, c) // the edge's first counts, before it knew who serves the key
	scripts := func(a, b []int) int { return b[1] - a[1] + b[2] - a[2] }
	t.Logf("per request: 50 uncounted → %d PTTL, %d script calls; 20 counted → %d PTTL (%d of them for the tallies of the first counts), %d script calls",
		ok[0]-before[0], scripts(before, ok), counted[0]-ok[0], start, scripts(ok, counted))
	require.Equal(t, 50, ok[0]-before[0], "one PTTL per request")
	require.Zero(t, scripts(before, ok), "an uncounted response costs no script call")
	require.Equal(t, 20, counted[0]-ok[0]-start)
	// The counts run after their responses, so all 20 may be sent before
	// the edge's identity read lands (a Redis stall on a busy host): once
	// it has, a count leaves the tallies as they are.
	for deadline := time.Now().Add(10 * time.Second); ; {
		was, n := tallied(t, c), escapeCount(t, r, "stuffing", "response_counted")
		require.Equal(t, []int{401}, codes(t, r, 1, "/status?code=401"))
		require.Eventually(t, func() bool { return escapeCount(t, r, "stuffing", "response_counted") > n },
			10*time.Second, 5*time.Millisecond)
		if tallied(t, c) == was {
			break
		}
		require.True(t, time.Now().Before(deadline), "counts made once the edge knows who serves the key are not tallied")
	}
	require.LessOrEqual(t, scripts(ok, counted), 20+1, "at most one script call per counted response (a NOSCRIPT load aside)")
	require.Positive(t, scripts(ok, counted))
}

// tallied is how many units the edges' tallied fixed window takes admitted
// in Redis (the <key>:fw:post:<server> hashes): the takes an edge makes
// before it has read who serves their key, or after a sign of a master
// change, each of which asks Redis a PTTL more, for its tally.
func tallied(t *testing.T, c *redis.Client) int {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*:fw:post:*").Result()
	require.NoError(t, err)
	n := 0
	for _, k := range keys {
		vals, err := c.HVals(ctx, k).Result()
		require.NoError(t, err)
		for _, v := range vals {
			u, err := strconv.Atoi(v)
			require.NoError(t, err)
			n += u
		}
	}
	return n
}

func repeatInt(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestBypassAccessLog: the access log says a request was bypassed.
func TestBypassAccessLog(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 1
    window: 1m
    bypass:
      path_prefix: [/healthz]
`, func(c *config.Config) { c.AccessLog, c.AccessLogSample = logPath, 1 })
	require.Equal(t, []int{200, 200}, codes(t, r, 2, "/healthz"))
	r.stop()
	b, err := os.ReadFile(logPath)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2)
	require.Contains(t, lines[0], `"decision":"bypass"`)
	require.Contains(t, lines[0], `"bypassed":["per-ip"]`)
}
