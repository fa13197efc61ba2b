package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

const problemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

// TestGracefulShutdownLosesNoInFlightRequest sends SIGTERM while requests
// wait on a slow origin: /readyz turns 503 during the drain delay, every
// in-flight request completes with 200 and the process exits 0.
func TestGracefulShutdownLosesNoInFlightRequest(t *testing.T) {
	const (
		inflight   = 20
		originTime = 500 * time.Millisecond
		drainDelay = 300 * time.Millisecond
	)
	org := startOrigin(t, originTime)
	e := startEdge(t, "--origin", org.URL, "--drain-delay", drainDelay.String(), "--rules", writeRules(t, `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 1000
    window: 1m
`))
	client := newClient(t, inflight)
	type result struct {
		reply
		at time.Time // when the response was complete
	}
	results := make(chan result, inflight)
	for range inflight {
		go func() {
			r := get(client, e.url("/"))
			results <- result{r, time.Now()}
		}()
	}
	// Every request is past the edge and waiting on the origin.
	require.NoError(t, proc.PollEvery(testenv.Within(t, 5*time.Second), 2*time.Millisecond, "every request at the origin", func(context.Context) error {
		if n := org.arrived.Load(); n < inflight {
			return fmt.Errorf("%d of %d requests reached the origin", n, inflight)
		}
		return nil
	}))

	sigterm := time.Now()
	e.Signal(syscall.SIGTERM)
	admin := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var draining time.Time
	// Polled at a fixed 2 ms: when /readyz turned is a figure of the test.
	require.NoError(t, proc.PollEvery(testenv.Within(t, 2*time.Second), 2*time.Millisecond, "/readyz to answer 503", func(context.Context) error {
		resp, err := admin.Get("http://" + e.Admin + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		draining = time.Now()
		return nil
	}), "/readyz must turn 503 once draining starts")

	var first, last time.Time
	for i := range inflight {
		select {
		case r := <-results:
			require.NoError(t, r.err, "in-flight request %d", i)
			require.Equal(t, http.StatusOK, r.code, "in-flight request %d: %s", i, r.body)
			require.Equal(t, "ok\n", string(r.body))
			if first.IsZero() || r.at.Before(first) {
				first = r.at
			}
			if r.at.After(last) {
				last = r.at
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d in-flight requests never completed", inflight-i, inflight)
		}
	}
	require.True(t, draining.Before(first), "/readyz answered 503 while every request was still in flight")
	// The last request reached the origin just before SIGTERM and takes
	// originTime: it was in flight when the drain delay ended, the listener
	// closed and the server's shutdown began.
	require.Greater(t, last.Sub(sigterm), drainDelay, "a request outlived the drain delay")
	code, exited := e.WaitExit(10 * time.Second)
	require.True(t, exited, "the edge did not exit within 10s of SIGTERM")
	require.Zero(t, code, "exit code")
	t.Logf("after SIGTERM: /readyz 503 at %s, in-flight responses from %s to %s, exit 0 at %s",
		draining.Sub(sigterm).Round(time.Millisecond), first.Sub(sigterm).Round(time.Millisecond), last.Sub(sigterm).Round(time.Millisecond), time.Since(sigterm).Round(time.Millisecond))
}

// TestInvalidRulesFileRefusesToStart: the process exits non-zero and its
// log names the rule and the field.
func TestInvalidRulesFileRefusesToStart(t *testing.T) {
	ports := freePorts(t, 2)
	e := spawnEdge(t, "--listen", "127.0.0.1:"+strconv.Itoa(ports[0]), "--admin", "127.0.0.1:"+strconv.Itoa(ports[1]),
		"--origin", "http://127.0.0.1:1", "--rules", writeRules(t, `
version: 1
rules:
  - id: fine
    key: [ip]
    algorithm: fixed_window
    limit: 10
    window: 1m
  - id: broken
    key: [ip]
    algorithm: sliding_log
    limit: 0
    window: 1m
`))
	code, exited := e.WaitExit(15 * time.Second)
	require.True(t, exited, "an edge with an invalid rules file must not keep running")
	require.NotZero(t, code)
	// The log is JSON lines: the message is in the err field, unescaped.
	var errs []string
	for line := range strings.Lines(e.out.String()) {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Err   string `json:"err"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "ERROR" {
			errs = append(errs, rec.Msg+": "+rec.Err)
		}
	}
	require.NotEmpty(t, errs, "no error logged:\n%s", e.out.String())
	require.Contains(t, strings.Join(errs, "\n"), `rule "broken": limit`)
	require.NotContains(t, strings.Join(errs, "\n"), `rule "fine"`)
	t.Logf("exit %d: %s", code, strings.Join(errs, " | "))
}

// TestFailModesWithRedisDown starts edges whose Redis refuses connections.
func TestFailModesWithRedisDown(t *testing.T) {
	org := startOrigin(t, 0)
	rules := writeRules(t, `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 10
    window: 1m
`)
	dead := "redis://" + closedAddr(t)
	client := newClient(t, 1)
	edge := func(t *testing.T, mode string, args ...string) *edgeProc {
		return startEdge(t, append([]string{"--origin", org.URL, "--rules", rules, "--redis", dead, "--fail-mode", mode,
			"--key-salt", testenv.KeyPrefix(t)}, args...)...)
	}

	t.Run("closed answers 503", func(t *testing.T) {
		e := startUnreadyEdge(t, "--origin", org.URL, "--rules", rules, "--redis", dead, "--fail-mode", "closed",
			"--key-salt", testenv.KeyPrefix(t))
		for range 3 {
			r := get(client, e.url("/"))
			require.NoError(t, r.err)
			require.Equal(t, http.StatusServiceUnavailable, r.code)
			retry, err := strconv.Atoi(r.header.Get("Retry-After"))
			require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
			require.GreaterOrEqual(t, retry, 1)
			require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
			var p problem
			require.NoError(t, json.Unmarshal(r.body, &p))
			require.Equal(t, problemReducedCapacity, p.Type)
			require.Equal(t, 503, p.Status)
		}
		m := scrape(t, e)
		require.Equal(t, 3.0, sum(m, mRequests, "outcome", "unavailable"))
		require.Zero(t, sum(m, mRequests, "outcome", "proxied"))
	})

	// An edge alone decides in the fallback: its own count is the store's
	// whole count, and it admits the limit (÷ 1 node), no more.
	t.Run("fallback enforces the limit alone", func(t *testing.T) {
		e := edge(t, "fallback", "--nodes-in-region", "1")
		var got []int
		var denied reply
		for range 12 {
			r := get(client, e.url("/"))
			require.NoError(t, r.err)
			got = append(got, r.code)
			if r.code == http.StatusTooManyRequests && denied.code == 0 {
				denied = r
			}
		}
		require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429}, got)
		require.NoError(t, checkDenied(denied, 10), "the fallback's 429 carries the rule's fields")
		m := scrape(t, e)
		require.Equal(t, 10.0, sum(m, mDecisions, "reason", "fallback", "decision", "allowed"))
		require.Equal(t, 2.0, sum(m, mDecisions, "reason", "fallback", "decision", "denied"))
		require.Equal(t, 12.0, sum(m, mFallback))
	})

	// An edge among two that has not heard from Redis for a window since it
	// started cannot know what the other counted: an exact rule's fallback
	// denies (with the rule's fields) rather than take a share of a limit
	// the other edge may have spent.
	t.Run("fallback shared denies within the window", func(t *testing.T) {
		e := edge(t, "fallback", "--nodes-in-region", "2")
		for i := range 5 {
			r := get(client, e.url("/"))
			require.NoError(t, r.err)
			require.Equal(t, http.StatusTooManyRequests, r.code, "request %d", i+1)
			require.NoError(t, checkDenied(r, 10), "the fallback's 429 carries the rule's fields")
		}
		m := scrape(t, e)
		require.Zero(t, sum(m, mDecisions, "reason", "fallback", "decision", "allowed"))
		require.Equal(t, 5.0, sum(m, mDecisions, "reason", "fallback", "decision", "denied"))
		require.Equal(t, 5.0, sum(m, "edgeguard_limiter_fallback_unknown_total"))
	})

	t.Run("open admits", func(t *testing.T) {
		e := edge(t, "open")
		for i := range 12 {
			r := get(client, e.url("/"))
			require.NoError(t, r.err)
			require.Equal(t, http.StatusOK, r.code, "request %d", i+1)
		}
		require.Equal(t, 12.0, sum(scrape(t, e), mDecisions, "reason", "open", "decision", "allowed"))
	})
}
