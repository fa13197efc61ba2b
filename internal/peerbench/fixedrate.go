package peerbench

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// fixedRate sends GET url at rate requests a second for d over conns
// keep-alive connections and returns the 99th percentile of the latency,
// each request timed from when the schedule said to send it (so a request
// held up behind a slow one counts the wait: no coordinated omission).
// A request that fails, or that could not be sent within a second of its
// time for want of a free connection, fails the run.
func fixedRate(ctx context.Context, addr string, tlsConf *tls.Config, path string, rate float64, conns int, d time.Duration) (time.Duration, error) {
	n := int64(rate * d.Seconds())
	if rate <= 0 || n < 1 {
		return 0, fmt.Errorf("fixed rate %.1f/s for %s: no request to send", rate, d)
	}
	c := &fasthttp.HostClient{Addr: addr, MaxConns: conns, MaxConnWaitTimeout: time.Second, IsTLS: tlsConf != nil, TLSConfig: tlsConf}
	defer c.CloseIdleConnections()
	lat := make([]time.Duration, n)
	interval := float64(time.Second) / rate
	start := time.Now()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			scheme := "http://"
			if tlsConf != nil {
				scheme = "https://"
			}
			req.SetRequestURI(scheme + addr + path)
			for {
				i := next.Add(1) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				at := start.Add(time.Duration(float64(i) * interval))
				if w := time.Until(at); w > 0 {
					time.Sleep(w) // pacing: the schedule, not a wait for an event
				}
				if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("request %d at %.0f/s: %w", i, rate, err) })
					next.Store(n)
					return
				}
				lat[i] = time.Since(at)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	slices.Sort(lat)
	return lat[min(len(lat)-1, int(0.99*float64(len(lat))))], nil
}
