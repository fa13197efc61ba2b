package drills

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// load is steady open-loop traffic: every client sends Rate requests per
// second (whether or not earlier ones answered), each to the next target
// in turn, from its own X-Forwarded-For address (the edges trust
// 127.0.0.1 as a proxy), with an X-Priority tier.
type load struct {
	Clients  []string // client IPs
	Rate     float64  // requests per second per client
	Path     string
	Priority string
	// Targets returns the base URLs to spread requests over; it is asked
	// for every request, so a DNS-following source sees answers change.
	Targets func() []string

	mu       sync.Mutex
	codes    map[int]int            // status → count (0 = transport error)
	byClient map[string]map[int]int // client → status → count
	admits   map[string][]interval  // client → admitted requests' send→receive
	fiveXX   []time.Duration        // when 5xx or errors happened, from start
	samples  []string               // the first few 5xx bodies and errors
	start    time.Time
	next     atomic.Uint64
	client   *http.Client
}

func (l *load) run(ctx context.Context) {
	l.codes = map[int]int{}
	l.byClient = map[string]map[int]int{}
	l.admits = map[string][]interval{}
	l.start = time.Now()
	l.client = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 10 * time.Second,
	}}
	defer l.client.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, c := range l.Clients {
		l.byClient[c] = map[int]int{}
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
			defer tick.Stop()
			var inflight sync.WaitGroup
			defer inflight.Wait()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					inflight.Go(func() { l.one(c) })
				}
			}
		})
	}
	wg.Wait()
}

func (l *load) one(clientIP string) {
	sent := time.Now()
	targets := l.Targets()
	code := 0
	sample := "no target"
	if len(targets) > 0 {
		url := targets[int(l.next.Add(1))%len(targets)] + l.Path
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err == nil {
			req.Header.Set("X-Forwarded-For", clientIP)
			if l.Priority != "" {
				req.Header.Set("X-Priority", l.Priority)
			}
			resp, err := l.client.Do(req)
			if err == nil {
				code = resp.StatusCode
				if code >= 500 {
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
					sample = fmt.Sprintf("%s: %d %s", url, code, body)
				}
				resp.Body.Close()
			} else {
				sample = err.Error()
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[code]++
	l.byClient[clientIP][code]++
	if code >= 200 && code < 300 {
		l.admits[clientIP] = append(l.admits[clientIP], interval{sent, time.Now()})
	}
	if code == 0 || code >= 500 {
		l.fiveXX = append(l.fiveXX, time.Since(l.start))
		if len(l.samples) < 3 {
			l.samples = append(l.samples, fmt.Sprintf("at %s: %s", time.Since(l.start).Round(time.Millisecond), sample))
		}
	}
}

// interval is one request from send to receive.
type interval struct{ sent, recv time.Time }

// maxInWindow is the most admissions of one client whose whole send→receive
// intervals fall inside one window of length w (client-side times are
// jittery: intervals, not points).
func (l *load) maxInWindow(w time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	best := 0
	for _, as := range l.admits {
		for _, a := range as {
			n := 0
			for _, b := range as {
				if !b.sent.Before(a.sent) && !b.recv.After(a.sent.Add(w)) {
					n++
				}
			}
			best = max(best, n)
		}
	}
	return best
}

// summary returns counts by class: 2xx, 429, 5xx, errors.
func (l *load) summary() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for code, n := range l.codes {
		switch {
		case code == 0:
			out["errors"] += n
		case code == http.StatusTooManyRequests:
			out["429"] += n
		case code >= 500:
			out[fmt.Sprintf("%d", code)] += n
		case code >= 200 && code < 300:
			out["2xx"] += n
		default:
			out[fmt.Sprintf("%d", code)] += n
		}
	}
	return out
}

// admitted returns each client's 2xx count.

func (l *load) failures() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.fiveXX)
}

// failureSamples are the first few failures, for the report.
func (l *load) failureSamples() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.samples...)
}

// clientIPs returns n documentation-range client addresses, distinct per
// prefix so drills never share rate-limit keys.
func clientIPs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("%s.%d", prefix, i+1)
	}
	return out
}

func staticTargets(urls []string) func() []string { return func() []string { return urls } }
