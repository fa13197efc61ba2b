package peerbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// offer sends GET /item for host at a fixed rate from start until end,
// from src over at most conns keep-alive connections, each request on its
// own schedule whatever the others' fate (an open loop: a slow answer does
// not slow the offer, as it would a client that waits for each answer).
// Each request is counted in the count at returns for its scheduled time,
// its latency taken from that time (a request that waited for a free
// connection counts the wait), and abandoned deadline after it: a request
// not answered by then is lost, counted as a timeout. It returns once
// every request is counted. trace, when set, also gets each request's
// scheduled time, its latency and whether it was answered 200 in time.
func offer(ctx context.Context, addr, src, host string, rate float64, conns int, deadline time.Duration, start, end time.Time,
	at func(time.Time) *count, trace func(sched time.Time, took time.Duration, good bool)) {
	if rate <= 0 {
		return
	}
	d := &net.Dialer{Timeout: deadline, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &fasthttp.HostClient{Addr: addr, MaxConns: conns, MaxIdemponentCallAttempts: 1, MaxConnWaitTimeout: deadline,
		Dial: func(a string) (net.Conn, error) { return d.Dial("tcp", a) }}
	defer c.CloseIdleConnections()
	interval := time.Duration(float64(time.Second) / rate)
	var wg sync.WaitGroup
	defer wg.Wait()
	for sched := start; sched.Before(end) && ctx.Err() == nil; sched = sched.Add(interval) {
		if w := time.Until(sched); w > 0 {
			select {
			case <-time.After(w): // the schedule, not a wait for an event
			case <-ctx.Done():
				return
			}
		}
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/item")
			req.UseHostHeader = true
			req.Header.SetHost(host)
			lag := time.Since(sched)
			err := c.DoDeadline(req, resp, sched.Add(deadline))
			took := time.Since(sched)
			if err != nil {
				err = fmt.Errorf("from %s for %s at a fixed rate: %w", src, host, err)
			}
			cnt := at(sched)
			cnt.add(resp.StatusCode(), resp.Body(), took, err)
			cnt.mu.Lock()
			cnt.lag = append(cnt.lag, lag)
			cnt.mu.Unlock()
			if trace != nil {
				trace(sched, took, err == nil && resp.StatusCode() == 200 && took <= deadline)
			}
		})
	}
}

// isTimeout is a request given up: no answer by its deadline, or no free
// connection to send it on by then.
func isTimeout(err error) bool {
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrNoFreeConns) ||
		errors.Is(err, fasthttp.ErrDialTimeout)
}

// inTime is how many requests were answered 200 within deadline.
func (c *count) inTime(deadline time.Duration) int {
	n := 0
	for _, d := range c.lat {
		if d <= deadline {
			n++
		}
	}
	return n
}

// lagP99 is the 99th percentile of how late, after their scheduled time,
// the client began sending (an open loop's own delay, 0 if none).
func (c *count) lagP99() time.Duration {
	if len(c.lag) == 0 {
		return 0
	}
	return pct(c.lag).p99
}

// joinTrace is a host joining mid-run, each of its requests by when it
// was scheduled, how long it took and whether it was answered 200 in time.
type joinTrace struct {
	mu    sync.Mutex
	start time.Time
	reqs  []joinReq
}

type joinReq struct {
	at, took time.Duration // scheduled at, after start
	good     bool
}

func (j *joinTrace) add(sched time.Time, took time.Duration, good bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.reqs = append(j.reqs, joinReq{sched.Sub(j.start), took, good})
}

// joined is how the joining host fared: after how long its first 200
// arrived, and from when on it was served at its rate: the start of the
// first bin of width bin after which every bin had at least 95 % of its
// requests answered 200 in time (-1 for either if never).
func (j *joinTrace) joined(bin time.Duration) (firstOK, atRate time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	firstOK, atRate = -1, -1
	var nBins int
	for _, r := range j.reqs {
		if r.good && (firstOK < 0 || r.at+r.took < firstOK) {
			firstOK = r.at + r.took
		}
		nBins = max(nBins, int(r.at/bin)+1)
	}
	sent, good := make([]int, nBins), make([]int, nBins)
	for _, r := range j.reqs {
		sent[r.at/bin]++
		if r.good {
			good[r.at/bin]++
		}
	}
	for i := nBins - 1; i >= 0; i-- {
		if sent[i] > 0 && float64(good[i]) < 0.95*float64(sent[i]) {
			break
		}
		if sent[i] > 0 {
			atRate = time.Duration(i) * bin
		}
	}
	return firstOK, atRate
}
