package regionctl

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// scrapedEdge stands in for an edge's admin port: its build_info, or a 500
// while down (Prometheus then marks its series stale).
type scrapedEdge struct {
	addr string
	down atomic.Bool
}

func startScrapedEdge(t *testing.T) *scrapedEdge {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := &scrapedEdge{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if e.down.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, `edgeguard_build_info{goversion="go",revision="r",version="v"} 1`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return e
}

// A canary is judged on figures that reach the end of its window: while
// Prometheus holds no scrape of the canary PoP, or of the rest of the
// region, taken since the window ended (a lagging or failing scrape), the
// judge waits for one, at most its bound. On a busy machine the edges'
// scrapes timed out for seconds, a 4 s window held no sample of the PoP,
// and a harmless canary was rolled back for serving 0 requests.
func TestCanaryWaitsForAScrapeAfterItsWindow(t *testing.T) {
	t.Parallel()
	ams, fra := startScrapedEdge(t), startScrapedEdge(t)
	prom, err := testenv.StartPrometheus(testenv.PrometheusOptions{ScrapeInterval: 500 * time.Millisecond,
		Jobs: []testenv.ScrapeJob{{Name: "edges", Targets: []string{ams.addr, fra.addr}, TargetLabels: map[string]map[string]string{
			ams.addr: {"region": "eu-west", "pop": "ams"},
			fra.addr: {"region": "eu-west", "pop": "fra"},
		}}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.Close() })
	ctx := context.Background()
	const timeout = 5 * time.Second

	// present says whether Prometheus's last scrape of pop succeeded.
	present := func(pop string) bool { return scrapedNow(t, prom.URL, pop) }
	require.Eventually(t, func() bool { return present("ams") && present("fra") }, 30*time.Second, 50*time.Millisecond)

	t.Run("both scraped", func(t *testing.T) {
		now := time.Now()
		waited, fresh := waitScraped(ctx, prom.URL, "eu-west", "ams", now.Add(-3*time.Second), now, 20*time.Second, timeout)
		require.True(t, fresh)
		require.Less(t, waited, 20*time.Second)
	})

	for _, down := range []*scrapedEdge{ams, fra} {
		name := map[*scrapedEdge]string{ams: "ams", fra: "fra"}[down]
		t.Run(name+" not scraped since the window ended", func(t *testing.T) {
			down.down.Store(true)
			require.Eventually(t, func() bool { return !present(name) }, 30*time.Second, 50*time.Millisecond)
			end := time.Now()

			// Within its bound, it gives up and says so.
			waited, fresh := waitScraped(ctx, prom.URL, "eu-west", "ams", end, end, time.Second, timeout)
			require.False(t, fresh)
			require.GreaterOrEqual(t, waited, time.Second)

			// It waits while the scrapes fail, and returns once one lands.
			type result struct {
				waited time.Duration
				fresh  bool
			}
			done := make(chan result, 1)
			go func() {
				w, f := waitScraped(ctx, prom.URL, "eu-west", "ams", end, end, 30*time.Second, timeout)
				done <- result{w, f}
			}()
			require.Never(t, func() bool { return len(done) > 0 }, time.Second, 50*time.Millisecond, "it judged without a scrape of %s", name)
			down.down.Store(false)
			var r result
			require.Eventually(t, func() bool {
				select {
				case r = <-done:
					return true
				default:
					return false
				}
			}, 30*time.Second, 50*time.Millisecond)
			require.True(t, r.fresh)
			require.GreaterOrEqual(t, r.waited, time.Second)
			// Two scrapes of it since end (the window loaded at end): what
			// an increase over the window needs.
			require.GreaterOrEqual(t, samplesSince(t, prom.URL, name, end), 2, "returned before Prometheus held two scrapes of %s in the window", name)
		})
	}

	t.Run("no Prometheus", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())
		now := time.Now()
		waited, fresh := waitScraped(ctx, dead, "eu-west", "ams", now, now, 20*time.Second, timeout)
		require.False(t, fresh)
		require.Less(t, waited, 10*time.Second, "a Prometheus that does not answer ends the wait: the figures' queries report it")
	})
}

// scrapedNow says whether Prometheus's last scrape of pop's edge succeeded:
// its build_info series is there (a failed scrape marks it stale).
func scrapedNow(t *testing.T, promURL, pop string) bool {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: promURL})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, _, _, err := promv1.NewAPI(c).Query(ctx, fmt.Sprintf(`edgeguard_build_info{region="eu-west",pop=%q}`, pop), time.Now())
	require.NoError(t, err)
	return len(v.(model.Vector)) > 0
}

// samplesSince counts Prometheus's successful scrapes of pop's edge since
// from: the build_info samples it holds after from.
func samplesSince(t *testing.T, promURL, pop string, from time.Time) int {
	t.Helper()
	c, err := api.NewClient(api.Config{Address: promURL})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now := time.Now()
	v, _, _, err := promv1.NewAPI(c).Query(ctx, fmt.Sprintf(`edgeguard_build_info{region="eu-west",pop=%q}[%dms]`, pop, now.Sub(from).Milliseconds()), now)
	require.NoError(t, err)
	n := 0
	for _, s := range v.(model.Matrix) {
		for _, p := range s.Values {
			if !p.Timestamp.Time().Before(from) {
				n++
			}
		}
	}
	return n
}
