package edge

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestHostWeightsFromConsul: host weights set with regionctl apply live to
// a running edge and weigh the shares it enforces. The edge (12 workers)
// starts without weights; `shedder set host_share.weights=A.Example.:2`
// (and a long queue_timeout, so admitted requests wait rather than time
// out) reaches it through Consul. Then b.example holds every worker at an
// origin that answers only when the test lets it, and a.example, spelled as
// a hostile client may spell it, sends 12 requests at once: with weights 2
// and 1 its share is 8, so 4 are refused at once (503 host_share) and 8
// wait for workers and are served once the origin answers (6 and 6 without
// the weight).
func TestHostWeightsFromConsul(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	var inFlight atomic.Int64
	hold := make(chan struct{})
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		if r.Host == "b.example" {
			<-hold
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer origin.Close()
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()
	const workers = 12
	e := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(t.TempDir(), "rules.yaml"), func(cfg *config.Config) {
		cfg.Origins, cfg.Workers = []string{origin.URL}, workers
	})
	require.Nil(t, e.shed.Config().HostShare.Weights)

	out, code := regionctlRun(t, "--consul", c.HTTPAddr(), "shedder", "set", "--region", "eu-west",
		"host_share.weights=A.Example.:2", "queue_timeout=5s")
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return e.shed.Config().HostShare.Weights["A.Example."] == 2 },
		10*time.Second, 20*time.Millisecond, "the weights reach the edge")

	send := func(host string, n int) <-chan int {
		codes := make(chan int, n)
		for range n {
			go func() {
				req, _ := http.NewRequest(http.MethodGet, "http://"+e.Addr()+"/", nil)
				req.Host = host
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					codes <- -1
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		return codes
	}
	bCodes := send("b.example", workers)
	require.Eventually(t, func() bool { return inFlight.Load() == workers }, 10*time.Second, time.Millisecond, "b.example holds every worker")

	aCodes := send("A.EXAMPLE.:80", workers)
	got := map[int]int{}
	for range workers - 8 {
		got[<-aCodes]++
	}
	require.Equal(t, map[int]int{http.StatusServiceUnavailable: workers - 8}, got, "refused at once: a.example over its share of 8")
	require.Equal(t, float64(workers-8), metricSum(t, e, "edgeguard_shedder_rejected_total", "reason", "host_share"))
	release()
	for range 8 {
		got[<-aCodes]++
	}
	for range workers {
		got[<-bCodes+1000]++ // b.example's codes apart
	}
	require.Equal(t, map[int]int{http.StatusServiceUnavailable: workers - 8, http.StatusOK: 8, 1000 + http.StatusOK: workers}, got,
		fmt.Sprintf("a.example's admitted 8 served; b.example's %d served", workers))
}
