package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestOverloadShedsLowTiersFirst offers ~3× an origin's capacity in a mix of
// tiers to an edge process. The origin serves at most `capacity` requests
// at once, 20 ms each; the edge runs as many workers. Critical traffic keeps
// ≥ 99% success, test and read traffic is shed before write, and the shed
// level returns to rest after the load stops. It runs here, against the
// built edge, because at 600 req/s an edge inside the race-instrumented
// test process measures the instrumentation as much as the shedder.
func TestOverloadShedsLowTiersFirst(t *testing.T) {
	const (
		capacity = 4
		service  = 20 * time.Millisecond
		// capacity / service = 200 req/s; offer 3×.
		offered  = 600
		overload = 5 * time.Second
	)
	originSlots := make(chan struct{}, capacity)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		originSlots <- struct{}{}
		time.Sleep(service) // kept: the origin's service time is the subject
		<-originSlots
		_, _ = io.WriteString(w, "ok")
	}))
	defer origin.Close()

	shedFile := filepath.Join(t.TempDir(), "shedder.json")
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.7, "bad": 0.8, "start_after": "1s", "full_after": "2s",
		"smoothing": "200ms", "share_window": "1s", "queue_size": 8, "queue_timeout": "50ms"}`), 0o600))
	e := startEdge(t, "--origin", origin.URL, "--workers", strconv.Itoa(capacity), "--shedder", shedFile,
		"--trusted-proxies", "127.0.0.1")

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	// run offers rate req/s for d, in a fixed tier mix, open loop.
	mix := []string{"test", "test", "read", "read", "read", "read", "write", "write", "write", "critical"}
	run := func(rate int, d time.Duration, tiers []string) []tierResult {
		return offerOpenLoop(rate, d, 1, nil, func(i, _ int, _ time.Time) tierResult {
			return sendTier(client, e.url("/"), tiers[i%len(tiers)])
		})[0]
	}

	run(40, 250*time.Millisecond, []string{"critical"}) // warm up connections
	unloaded := run(40, 2*time.Second, []string{"critical"})
	loaded := run(offered, overload, mix)

	stats := map[string][2]int{} // tier → {ok, total}
	for _, x := range loaded {
		s := stats[x.tier]
		s[1]++
		if x.code == 200 {
			s[0]++
		} else {
			require.Equal(t, 503, x.code, "overload answers 503, never anything else")
		}
		stats[x.tier] = s
	}
	rate := func(tier string) float64 { s := stats[tier]; return float64(s[0]) / float64(s[1]) }
	m := scrape(t, e)
	shed := map[string]float64{}
	for _, tier := range []string{"test", "read", "write", "critical"} {
		shed[tier] = sum(m, "edgeguard_shedder_shed_total", "tier", tier)
	}
	t.Logf("success under 3x overload: critical %.1f%%, write %.1f%%, read %.1f%%, test %.1f%% (%d requests); shed by the ramp: %v",
		100*rate("critical"), 100*rate("write"), 100*rate("read"), 100*rate("test"), len(loaded), shed)
	t.Logf("critical p99: unloaded %s, under 3x overload %s (ratio %.2f)",
		tierP99(unloaded, "critical"), tierP99(loaded, "critical"), float64(tierP99(loaded, "critical"))/float64(tierP99(unloaded, "critical")))

	require.GreaterOrEqual(t, rate("critical"), 0.99)
	require.Zero(t, shed["critical"], "critical is never shed by the ramp")
	require.Positive(t, shed["test"])
	require.Positive(t, shed["read"])
	// Lowest first: test is cut at least as much as read, read more than write.
	require.GreaterOrEqual(t, shed["test"]/float64(stats["test"][1]), shed["read"]/float64(stats["read"][1]))
	require.Greater(t, shed["read"]/float64(stats["read"][1]), shed["write"]/float64(stats["write"][1]))
	require.Greater(t, rate("write"), rate("read"))

	// After the load, the level returns to rest within start_after+full_after.
	require.NoError(t, proc.PollEvery(testenv.Within(t, 4*time.Second), 50*time.Millisecond, "the shed level back at rest", func(context.Context) error {
		m, err := scrapeErr(e)
		if err != nil {
			return err
		}
		if level := sum(m, "edgeguard_shedder_level"); level > 0 {
			return fmt.Errorf("shed level still %.2f", level)
		}
		return nil
	}))
}

// tierResult is a request of a priority tier: its status (0 when it got
// no answer) and how long it took.
type tierResult struct {
	tier    string
	code    int
	latency time.Duration
}

// sendTier sends GET url as a request of tier and times it.
func sendTier(client *http.Client, url, tier string) tierResult {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Priority", tier)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return tierResult{tier: tier, code: 0, latency: time.Since(start)}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return tierResult{tier: tier, code: resp.StatusCode, latency: time.Since(start)}
}

// tierP99 is the p99 latency of tier's answered (200) requests in rs, 0
// when there are none.
func tierP99(rs []tierResult, tier string) time.Duration {
	var ls []time.Duration
	for _, x := range rs {
		if x.tier == tier && x.code == 200 {
			ls = append(ls, x.latency)
		}
	}
	if len(ls) == 0 {
		return 0
	}
	slices.Sort(ls)
	return ls[len(ls)*99/100]
}

// offerOpenLoop offers rate requests a second for d, open loop: at each
// tick it calls during (when set) with the time since the start, then sends
// fan requests, send(i, k, start) for k < fan, each on its own goroutine.
// It returns the results by k once every request has answered.
func offerOpenLoop[R any](rate int, d time.Duration, fan int, during func(time.Duration), send func(i, k int, start time.Time) R) [][]R {
	out := make([][]R, fan)
	var mu sync.Mutex
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		<-tick.C
		if during != nil {
			during(time.Since(start))
		}
		for k := range fan {
			wg.Go(func() {
				r := send(i, k, start)
				mu.Lock()
				out[k] = append(out[k], r)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return out
}
