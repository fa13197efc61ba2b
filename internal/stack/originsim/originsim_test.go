package originsim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestCapacityBoundsConcurrentRequests(t *testing.T) {
	// 2 workers, 200 ms each, room for 2 waiting: of 10 requests sent at
	// once, 4 are served and 6 are turned away.
	srv := httptest.NewServer(Handler(Config{Workers: 2, ServiceTime: 200 * time.Millisecond, Queue: 2}, prometheus.NewRegistry()))
	defer srv.Close()

	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
	)
	for range 10 {
		wg.Go(func() {
			resp, err := http.Get(srv.URL + "/x")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusOK: 4, http.StatusServiceUnavailable: 6}, codes)
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg Config
		ok  bool
	}{
		"valid":            {Config{Workers: 1, ServiceTime: time.Millisecond}, true},
		"no workers":       {Config{Workers: 0}, false},
		"negative service": {Config{Workers: 1, ServiceTime: -1}, false},
		"negative queue":   {Config{Workers: 1, Queue: -1}, false},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

// sendAtOnce sends n requests to url at once and counts their statuses.
func sendAtOnce(t *testing.T, url string, n int) map[int]int {
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			resp, err := http.Get(url)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return codes
}

func putCapacity(t *testing.T, url, body string) (int, Capacity) {
	req, err := http.NewRequest(http.MethodPut, url+"/capacity", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var c Capacity
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	}
	return resp.StatusCode, c
}

func TestCapacityChangesWhileServing(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(Handler(Config{Workers: 4, ServiceTime: 200 * time.Millisecond, Queue: 0}, reg))
	defer srv.Close()
	require.Equal(t, map[int]int{http.StatusOK: 4, http.StatusServiceUnavailable: 4}, sendAtOnce(t, srv.URL+"/x", 8))

	// Halved: two of the same burst are served.
	code, c := putCapacity(t, srv.URL, `{"workers": 2}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, Capacity{Workers: 2, ServiceTime: "200ms", RPS: 10}, c)
	require.Equal(t, map[int]int{http.StatusOK: 2, http.StatusServiceUnavailable: 6}, sendAtOnce(t, srv.URL+"/x", 8))

	// Slower at the same workers; the gauges follow.
	code, c = putCapacity(t, srv.URL, `{"service_time": "400ms"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, Capacity{Workers: 2, ServiceTime: "400ms", RPS: 5}, c)
	require.Equal(t, 5.0, gaugeOf(t, reg, "edgeguard_originsim_capacity_rps"))
	require.Equal(t, 2.0, gaugeOf(t, reg, "edgeguard_originsim_workers"))

	resp, err := http.Get(srv.URL + "/capacity")
	require.NoError(t, err)
	var got Capacity
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	resp.Body.Close()
	require.Equal(t, c, got)

	for name, body := range map[string]string{
		"negative workers": `{"workers": -1}`,
		"bad duration":     `{"service_time": "fast"}`,
		"unknown field":    `{"threads": 4}`,
	} {
		t.Run(name, func(t *testing.T) {
			code, _ := putCapacity(t, srv.URL, body)
			require.Equal(t, http.StatusBadRequest, code)
		})
	}
}

// gaugeOf is a gauge's value in reg.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestPoolResize(t *testing.T) {
	p := newPool(1, 4)
	waiting := func(n int) func() bool {
		return func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.waiters) == n
		}
	}
	require.True(t, p.enter())
	require.True(t, p.acquire(nil))

	// A second request waits for the one worker; growing the pool gives it one.
	got := make(chan bool)
	require.True(t, p.enter())
	go func() { got <- p.acquire(nil) }()
	require.Eventually(t, waiting(1), 5*time.Second, time.Millisecond)
	p.resize(2)
	require.True(t, <-got)

	// Shrunk to 1 with 2 busy: a newcomer waits until both have finished.
	p.resize(1)
	require.True(t, p.enter())
	go func() { got <- p.acquire(nil) }()
	require.Eventually(t, waiting(1), 5*time.Second, time.Millisecond)
	p.release()
	require.True(t, waiting(1)(), "one worker busy of one: the newcomer still waits")
	p.release()
	require.True(t, <-got)

	// A waiter whose client leaves gives up its place in the origin.
	done := make(chan struct{})
	require.True(t, p.enter())
	go func() { got <- p.acquire(done) }()
	require.Eventually(t, waiting(1), 5*time.Second, time.Millisecond)
	close(done)
	require.False(t, <-got)
	p.release()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Equal(t, 0, p.inside)
	require.Equal(t, 0, p.busy)
}
