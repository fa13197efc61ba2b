package originsim

import (
	"net/http"
	"net/http/httptest"
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
