package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/stack/originsim"
)

// TestOverloadKeepsCriticalAtDefaults is a region of the stack in small:
// three edge processes at the default shedder settings (the ramp sheds
// nothing for its first 28 s, so the worker cap and its queue are all that
// stand between the overload and critical traffic) with the stack's worker
// cap (128) in front of one origin of 4 workers × 20 ms (200 req/s: half the
// stack's origin program, so the load generator's own 600 requests/s hold
// their schedule on a loaded machine), offered 3× that in a
// test/read/write/critical mix. The origin serves in arrival order, across the edges: a slot of one
// edge frees when the origin reaches that edge's requests, so one edge can
// go tens of milliseconds without a free slot while the origin works
// through the others'. Critical requests must still succeed
// (≥ 99.9%), the lower tiers take the rejections, lowest first, and the
// highest of them still gets through.
//
// The 99.9% holds for that origin and that load: on a machine too busy to
// run them (the origin's 20 ms services run long, the load generator sends
// late and in bursts; at a load average of 20 the origin fell behind by
// more than the edges' 10 s header timeout, and critical requests waited
// behind the others' in the origin's queue) it is not this edge's to keep.
// The run measures the machine in the same process: how long the origin's
// 20 ms sleeps really take (its capacity on this machine), and how late
// the requests left. A run that kept its premise is held to the 99.9%; one
// that did not is held to what the edge decides whatever the machine:
// the ramp never sheds a critical request, one refused for the worker cap
// waited its critical_queue_timeout first (asserted in every run), critical
// does at least as well as every other tier, lowest tiers first, and every
// failure is a 503 of the edge's or a 504 the edges counted as the
// origin's lateness. In every run, every request gets an answer.
func TestOverloadKeepsCriticalAtDefaults(t *testing.T) {
	const (
		originWorkers = 4
		service       = 20 * time.Millisecond
		capacity      = originWorkers * int(time.Second/service) // 200 req/s
		offered       = 3 * capacity
		overload      = 20 * time.Second
		edgeWorkers   = 128              // the stack's us-east edges
		edgeCount     = 3                // a region's worth sharing the origin: eu-west's
		readTimeout   = 10 * time.Second // the edges' --read-timeout, the default
	)
	reg := prometheus.NewRegistry()
	origin := httptest.NewServer(originsim.Handler(originsim.Config{Workers: originWorkers, ServiceTime: service, Queue: 4096}, reg))
	defer origin.Close()

	var edges []*edgeProc
	for range edgeCount {
		edges = append(edges, startEdge(t, "--origin", origin.URL, "--workers", strconv.Itoa(edgeWorkers),
			"--trusted-proxies", "127.0.0.1", "--log-level", "warn"))
	}
	// An edge answers 408 on a new connection that sent nothing within
	// --read-timeout (10 s) of its accept. The load generator's transport
	// dials a connection for a request that then takes another one coming
	// free, and keeps the new one idle, unused; when the load comes in
	// bursts (a late sender), a burst can reach such a connection just as
	// the edge gives up on it, and read the 408 as its answer: the
	// client's timing, not the edge's decision. The transport sends on no
	// connection idle for more than half the edge's read timeout, so every
	// request it sends goes to a connection the edge is still reading.
	// (On a machine too busy for the test's own client, its idle timer
	// fires late: each request notes how old its connection was when it
	// was written, and a 408, or a POST on a connection the edge closed,
	// is the client's only on a connection older than the read timeout.)
	//
	// The client waits up to a minute for an answer: the edge answers
	// every request well within that by its own deadlines (a critical
	// request's 2 s in the queue, then the origin's 1 s dial and 10 s for
	// its header), and a request it leaves unanswered fails the test in
	// every run. A 15 s wait was too short for a client starved for
	// seconds on a busy machine: it gave up on answers still coming.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048, IdleConnTimeout: readTimeout / 2, DialContext: datedDial}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	// 10% test, 50% read, 30% write, 10% critical, as overload.js sends.
	mix := []string{"test", "read", "read", "read", "read", "read", "write", "write", "write", "critical"}
	stopProbe := make(chan struct{})
	probed := make(chan time.Duration, 1)
	go func() { probed <- meanSleep(service, stopProbe) }()
	out, sent := offerMix(client, edges, mix, offered, overload)
	close(stopProbe)
	sleep := <-probed
	codes, errs, failedAt := countCodes(out)
	success := codes.success
	rejected, criticalWaits, criticalLongWaits := shedderRejections(t, edges)
	served := counterValue(t, reg, "edgeguard_originsim_requests_total", "outcome", "served")
	headerTimeouts, criticalWaitsOver1s := 0.0, 0.0
	for _, e := range edges {
		m := scrape(t, e)
		headerTimeouts += sum(m, "edgeguard_origin_timeouts_total", "phase", "header")
		n, within := histogramCount(m, "edgeguard_shedder_queue_wait_seconds", "critical", 1)
		criticalWaitsOver1s += n - within
	}
	// The machine, measured in this run: the origin's capacity here (its
	// workers over how long a 20 ms sleep took) and how late the load
	// generator sent (p99).
	machineCapacity := float64(originWorkers) / sleep.Seconds()
	late := sendLateness(out, 0.99)
	kept := machineCapacity >= 0.8*float64(capacity) && late <= 100*time.Millisecond
	t.Logf("%d requests sent in %s at %d/s; success: critical %.2f%%, write %.2f%%, read %.2f%%, test %.2f%%; codes %v; no answer, by tier/error: %v",
		len(out), sent.Round(time.Millisecond), offered, 100*success("critical"), 100*success("write"), 100*success("read"), 100*success("test"), codes, errs)
	t.Logf("edge rejections by tier/reason: %v; critical requests queued %.0f, of which %.0f waited > 50 ms; origin served %.0f (%.0f/s of %d/s); origin header timeouts %.0f; critical requests that waited > 1 s %.0f",
		rejected, criticalWaits, criticalLongWaits, served, served/sent.Seconds(), capacity, headerTimeouts, criticalWaitsOver1s)
	t.Logf("machine: a %v sleep took %v (origin capacity here %.0f/s of %d/s), requests sent up to %v late (p99): premise kept: %v",
		service, sleep.Round(10*time.Microsecond), machineCapacity, capacity, late.Round(time.Millisecond), kept)

	require.Zero(t, rejected["critical/ramp"], "the ramp never sheds critical traffic")
	// A critical request the worker cap refuses has waited its
	// critical_queue_timeout (2 s) for a slot: a timer never fires early,
	// however busy the machine.
	require.GreaterOrEqual(t, criticalWaitsOver1s, rejected["critical/queue_timeout"], "every critical request refused for the worker cap first waited its critical_queue_timeout (2 s), not the sheddable tiers' 50 ms")
	allowed := []int{http.StatusOK, http.StatusServiceUnavailable}
	if !kept {
		// The origin's lateness, counted by the edges: 504s, never more
		// than the header timeouts they saw.
		allowed = append(allowed, http.StatusGatewayTimeout)
		require.LessOrEqual(t, float64(codes.count(http.StatusGatewayTimeout)), headerTimeouts, "every 504 is an origin header timeout the edges counted")
	}
	// A 408, or a request sent on a connection the edge closed as idle
	// (net/http does not send a POST again), is the client's timing only
	// when the client wrote it on a connection it had held, unused, for the
	// edge's whole read timeout: the edge's clock starts at its accept,
	// after the dial. The client's idle timer fired late.
	for _, r := range out {
		switch {
		case r.code == http.StatusRequestTimeout:
			require.GreaterOrEqual(t, r.connAge, readTimeout, "a 408 (sent at %v) answers only a request written on a connection older than the edge's read timeout", r.at)
		case r.code == 0:
			require.Equal(t, closedIdle, r.err, "every request gets an answer (%s)", r.timeline())
			require.GreaterOrEqual(t, r.connAge, readTimeout, "the edge closes a connection as idle (a request sent on it at %v) only past its read timeout", r.at)
		}
	}
	allowed = append(allowed, http.StatusRequestTimeout, 0) // each checked above
	for tier, cs := range codes {
		for code := range cs {
			require.Contains(t, allowed, code, "tier %s: overload answers 200 or 503 (or, on a machine too busy for the origin, the origin's 504, and a 408 on a connection the client kept too long), never anything else (no answer, by tier/error: %v)", tier, errs)
		}
	}
	if kept {
		require.GreaterOrEqual(t, success("critical"), 0.999, "critical success (failures sent at %v)", failedAt)
	} else {
		require.GreaterOrEqual(t, success("critical"), max(success("write"), success("read"), success("test")), "critical does at least as well as every other tier (failures sent at %v)", failedAt)
	}
	// Witness of the overload: the lower tiers lost most of their requests.
	require.Less(t, success("read"), 0.5)
	// Lowest first. Both tiers are almost fully cut, in the worker queue
	// (the ramp sheds nothing yet at the defaults): a request finding a
	// free worker is admitted whatever its tier, and only one that waits
	// beside a higher tier's loses to it (the queue's order by tier:
	// pkg/shedder's TestWorkersPriorityQueue). The two rates are then
	// close, and the test tier's, from a fifth of read's requests, moves by
	// sampling alone: test may exceed read by three standard errors of the
	// difference at most (at least one point). One point alone was about
	// 1.2 of them: under the busy recipe a run read test 8.33 % (100 of
	// 1,200) against read 7.27 % (436 of 6,000).
	nTest, nRead := float64(codes.total("test")), float64(codes.total("read"))
	pooled := (success("test")*nTest + success("read")*nRead) / (nTest + nRead)
	slack := max(0.01, 3*math.Sqrt(pooled*(1-pooled)*(1/nTest+1/nRead)))
	require.LessOrEqual(t, success("test"), success("read")+slack, "the lowest tier does no better than read, within %.2f points", 100*slack)
	require.Less(t, success("read"), success("write"))
	require.Less(t, success("write"), success("critical"))
	// Critical traffic is served without starving the rest: the highest
	// sheddable tier still gets through. (What the origin served is only
	// logged: its 20 ms sleeps run long on a loaded machine: 135/s of an
	// origin of 400/s at a load average of 18.)
	require.Greater(t, success("write"), 0.05)
}

// dueResult is one request of an open loop: its tier, its status (0 when
// it got no answer), when it was due, since the start, and how much later
// it left.
type dueResult struct {
	tier string
	code int
	err  string // why there was no answer: errKind of the client's error
	at   time.Duration
	late time.Duration
	// connAge is how long before the request was written its
	// connection's dial began (at least how long the edge had held it).
	connAge time.Duration
	// wrote, firstByte and ended are when the request was written, when
	// the answer's first byte came and when the client was done with it
	// (from the start of the offer; 0: never): what a request left without
	// an answer says of where it waited.
	wrote, firstByte, ended time.Duration
}

// timeline says when r was due, written, first answered and done.
func (r dueResult) timeline() string {
	return fmt.Sprintf("due at %v (sent %v late), written at %v, first byte at %v, done at %v, the connection %v old when written",
		r.at, r.late.Round(time.Millisecond), r.wrote.Round(time.Millisecond), r.firstByte.Round(time.Millisecond), r.ended.Round(time.Millisecond), r.connAge.Round(time.Millisecond))
}

// datedConn is a connection that knows when its dial began.
type datedConn struct {
	net.Conn
	dialed time.Time
}

// datedDial dials a datedConn. The time is read before the dial: the
// edge cannot accept a connection before it, while a time read after the
// dial returns can be seconds late on a starved client (and a connection's
// age then too short).
func datedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	dialed := time.Now()
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &datedConn{Conn: c, dialed: dialed}, nil
}

// closedIdle is errKind's name for a request sent on a connection the edge
// had closed as idle.
const closedIdle = "closed_idle"

// errKind names a client error by its kind, so a run's failures can be
// counted by it: the client's own timeout, a connection the edge reset or
// closed, or the error itself.
func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case strings.Contains(err.Error(), "server closed idle connection"):
		// net/http's own error for a connection closed as a request
		// (one it may not send again: a POST) was sent on it.
		return closedIdle
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	}
	return err.Error()
}

// meanSleep is how long, on average, a sleep of d takes on this machine
// until stop: the origin's workers sleep d per request, so their capacity
// here is workers over it.
func meanSleep(d time.Duration, stop <-chan struct{}) time.Duration {
	var total time.Duration
	n := 0
	for {
		select {
		case <-stop:
			return total / time.Duration(max(n, 1))
		default:
		}
		start := time.Now()
		time.Sleep(d) // the measurement itself: what the origin's sleeps take
		total += time.Since(start)
		n++
	}
}

// sendLateness is the q quantile of how late out's requests left.
func sendLateness(out []dueResult, q float64) time.Duration {
	if len(out) == 0 {
		return 0
	}
	ls := make([]time.Duration, len(out))
	for i, r := range out {
		ls[i] = r.late
	}
	slices.Sort(ls)
	return ls[min(len(ls)-1, int(q*float64(len(ls))))]
}

// offerMix offers offered requests a second to the edges for d, open loop:
// each request is sent when it is due, the tiers of mix in turn, a round
// of mix to each edge in turn. It returns every request's result once all
// have answered, and how long the sending took.
func offerMix(client *http.Client, edges []*edgeProc, mix []string, offered int, d time.Duration) ([]dueResult, time.Duration) {
	var (
		mu  sync.Mutex
		out []dueResult
		wg  sync.WaitGroup
	)
	begin := time.Now()
	for i := 0; ; i++ {
		at := time.Duration(i) * time.Second / time.Duration(offered)
		if at >= d {
			break
		}
		time.Sleep(time.Until(begin.Add(at))) // kept: an open loop sends each request when it is due
		tier, e := mix[i%len(mix)], edges[(i/len(mix))%len(edges)]
		late := time.Since(begin) - at
		wg.Go(func() {
			method := http.MethodGet
			if tier == "write" {
				method = http.MethodPost
			}
			r := dueResult{tier: tier, at: at, late: late}
			var age atomic.Int64              // the connection's, when the request took it and when it was written
			var wrote, firstByte atomic.Int64 // since begin
			var conn *datedConn
			trace := &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					if conn, _ = info.Conn.(*datedConn); conn != nil {
						age.Store(int64(time.Since(conn.dialed)))
					}
				},
				WroteRequest: func(httptrace.WroteRequestInfo) {
					if conn != nil {
						age.Store(int64(time.Since(conn.dialed)))
					}
					wrote.Store(int64(time.Since(begin)))
				},
				GotFirstResponseByte: func() { firstByte.Store(int64(time.Since(begin))) },
			}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, e.url("/orders"), nil)
			req.Header.Set("X-Priority", tier)
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				r.code = resp.StatusCode
			} else {
				r.err = errKind(err)
			}
			r.connAge = time.Duration(age.Load())
			r.wrote, r.firstByte, r.ended = time.Duration(wrote.Load()), time.Duration(firstByte.Load()), time.Since(begin)
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		})
	}
	sent := time.Since(begin)
	wg.Wait()
	return out, sent
}

// tierCodes counts each tier's answers by status.
type tierCodes map[string]map[int]int

// countCodes counts out's answers by tier and status (0: no answer, and
// errs counts those by tier and the client error's kind), and says when
// the first 20 critical requests that failed were due.
func countCodes(out []dueResult) (codes tierCodes, errs map[string]int, criticalFailedAt []string) {
	codes, errs = tierCodes{}, map[string]int{}
	for _, r := range out {
		if r.code == 0 {
			errs[r.tier+"/"+r.err]++
		}
		if codes[r.tier] == nil {
			codes[r.tier] = map[int]int{}
		}
		codes[r.tier][r.code]++
		if r.code != http.StatusOK && r.tier == "critical" && len(criticalFailedAt) < 20 {
			criticalFailedAt = append(criticalFailedAt, r.at.Round(time.Millisecond).String())
		}
	}
	return codes, errs, criticalFailedAt
}

// count is how many answers of every tier had status code.
func (c tierCodes) count(code int) int {
	n := 0
	for _, cs := range c {
		n += cs[code]
	}
	return n
}

// total is how many of tier's requests were answered (or not).
func (c tierCodes) total(tier string) int {
	n := 0
	for _, k := range c[tier] {
		n += k
	}
	return n
}

// success is the share of tier's requests answered 200.
func (c tierCodes) success(tier string) float64 {
	return float64(c[tier][http.StatusOK]) / float64(max(c.total(tier), 1))
}

// shedderRejections sums the edges' shedder rejections by tier/reason,
// and counts the critical requests they queued and those of them that
// waited past the sheddable tiers' 50 ms.
func shedderRejections(t *testing.T, edges []*edgeProc) (rejected map[string]float64, criticalWaits, criticalLongWaits float64) {
	rejected = map[string]float64{}
	for _, e := range edges {
		m := scrape(t, e)
		for _, tier := range []string{"test", "read", "write", "critical"} {
			for _, reason := range []string{"ramp", "queue_full", "queue_timeout"} {
				rejected[tier+"/"+reason] += sum(m, "edgeguard_shedder_rejected_total", "tier", tier, "reason", reason)
			}
		}
		n, within := histogramCount(m, "edgeguard_shedder_queue_wait_seconds", "critical", 0.05)
		criticalWaits += n
		criticalLongWaits += n - within
	}
	return rejected, criticalWaits, criticalLongWaits
}

// histogramCount returns the sample count of the histogram name's series
// for tier, and how many of them were at most le.
func histogramCount(m metrics, name, tier string, le float64) (total, within float64) {
	mf := m[name]
	if mf == nil {
		return 0, 0
	}
	for _, s := range mf.GetMetric() {
		match := false
		for _, l := range s.GetLabel() {
			match = match || l.GetName() == "tier" && l.GetValue() == tier
		}
		if !match || s.GetHistogram() == nil {
			continue
		}
		h := s.GetHistogram()
		total += float64(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == le {
				within += float64(b.GetCumulativeCount())
			}
		}
	}
	return total, within
}

// counterValue reads one counter of an in-process registry by label.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q} in the registry", name, label, value)
	return 0
}
