package origin

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// testClock is a clock a test walks forward.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestEjectionTime(t *testing.T) {
	for k, want := range map[int32]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 4: 4 * time.Minute, 5: 4 * time.Minute, 100: 4 * time.Minute} {
		require.Equal(t, want, ejectionTime(30*time.Second, k), "ejection %d", k)
	}
}

// Three origins, one dead: every request succeeds (a failed dial goes to
// another origin); the dead one leaves rotation after UnhealthyAfter
// failures, is tried by one request once EjectFor has passed, ejected
// again for twice as long when that fails, and back in rotation when it
// answers.
func TestEjectionAndProbation(t *testing.T) {
	a := startOrigin(t, okHandler("a"))
	b := startOrigin(t, okHandler("b"))
	// c is down: its address is reserved, nothing listens there yet.
	c := &testOrigin{t: t, addr: closedAddr(t), handler: okHandler("c")}
	t.Cleanup(c.stop)
	cfg := DefaultConfig()
	cfg.URLs = []string{a.url(), b.url(), c.url()}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 2
	cfg.EjectFor = 10 * time.Second
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	p, err := newPool(cfg, m, nil, clock.Now)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	connectErrors := func() float64 { return gathered(t, reg)["edgeguard_origin_errors_total{pool=default,reason=connect}"] }
	ejections := func() float64 { return gathered(t, reg)["edgeguard_origin_ejections_total{pool=default}"] }
	served := map[string]int{}
	serve := func(n int) {
		t.Helper()
		for i := range n {
			resp := get(t, edge, "/")
			require.Equal(t, fasthttp.StatusOK, resp.StatusCode(), "request %d: %s", i, resp.Body())
			served[string(resp.Body())]++
		}
	}

	for i := 0; p.Healthy() == 3; i++ {
		require.Less(t, i, 30, "the dead origin leaves rotation")
		serve(1)
	}
	require.Equal(t, []OriginStatus{{URL: a.url(), Healthy: true}, {URL: b.url(), Healthy: true}, {URL: c.url(), Healthy: false}}, p.Origins())
	require.Equal(t, 2.0, connectErrors())
	require.Equal(t, 1.0, ejections())

	serve(20)
	require.Equal(t, 2.0, connectErrors(), "ejected: not tried")

	clock.advance(10 * time.Second)
	serve(20)
	require.Equal(t, 3.0, connectErrors(), "on probation: tried by one request, which is retried elsewhere")
	require.Equal(t, 2.0, ejections(), "the failed probe ejects it again")

	clock.advance(10 * time.Second)
	serve(20)
	require.Equal(t, 3.0, connectErrors(), "the second ejection lasts twice as long")
	clock.advance(10 * time.Second)
	serve(20)
	require.Equal(t, 4.0, connectErrors(), "tried again once the second ejection is over")
	require.Equal(t, 3.0, ejections())

	ln, err := testenv.Listen(c.addr)
	require.NoError(t, err)
	c.serve(ln)
	clock.advance(40 * time.Second)
	before := len(c.requests())
	serve(1)
	require.Equal(t, before+1, len(c.requests()), "the probe goes to the ejected origin")
	require.Equal(t, 3, p.Healthy(), "a successful probe brings it back")
	require.Equal(t, 4.0, connectErrors())
	clear(served)
	serve(30)
	require.Positive(t, served["c"], "back in rotation: %v", served)
	require.Positive(t, served["a"], "%v", served)
	require.Positive(t, served["b"], "%v", served)
}

// While a probe is under way, the other requests keep out of the
// origin: only one request per EjectFor risks a dead origin.
func TestProbationOneProbe(t *testing.T) {
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + closedAddr(t), "http://" + closedAddr(t)}
	cfg.HealthCheckInterval = 0
	cfg.EjectFor = time.Second
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	p, err := newPool(cfg, nil, nil, clock.Now)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	out := p.origins[1]
	out.healthy.Store(false)
	out.ejectedUntil.Store(clock.Now().Add(time.Second).UnixNano())

	for range 10 {
		require.Same(t, p.origins[0], p.pick(nil), "ejected")
	}
	clock.advance(time.Second)
	var probes atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if p.pick(nil) == out {
				probes.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), probes.Load(), "one probe")
	clock.advance(time.Second)
	require.Same(t, out, p.pick(nil), "a probe that never answered leaves room for another after EjectFor")
}

// startSilentOrigin counts the requests that reached it, and answers none:
// it reads a request, then closes the connection.
func startSilentOrigin(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var got atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				buf := make([]byte, 4096)
				if n, _ := conn.Read(buf); n > 0 {
					got.Add(1)
				}
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return "http://" + ln.Addr().String(), &got
}

// A request goes to another origin only when none of it reached the
// first: a POST that reached an origin which then failed is answered 502,
// never sent again (a POST whose dial or TLS handshake failed is retried:
// TestTLSFailureRetriedAndEjected).
func TestPostNeverSentTwice(t *testing.T) {
	live := startOrigin(t, okHandler("live"))
	silentURL, silent := startSilentOrigin(t)
	cfg := DefaultConfig()
	cfg.URLs = []string{live.url(), silentURL}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 1000 // keep every origin in rotation
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	const n = 30
	ok, failed := 0, 0
	for range n {
		resp := rawExchange(t, edge, "POST /order HTTP/1.1\nHost: shop.example\nContent-Length: 5\n\nbuy=1")
		switch resp.StatusCode() {
		case 200:
			ok++
		case 502:
			failed++
		default:
			t.Fatalf("status %d", resp.StatusCode())
		}
	}
	require.Equal(t, ok, len(live.requests()))
	require.Equal(t, failed, int(silent.Load()), "each 502 is a POST the silent origin received, once")
	require.Equal(t, n, len(live.requests())+int(silent.Load()), "every POST reached exactly one origin once")
	require.Positive(t, failed, "the silent origin was picked")
	require.Positive(t, ok)
}

// Requests that were under way when an origin left rotation, and the last
// resort, fail without lengthening its ejection: only a failed probe does.
func TestEjectionNotLengthenedByStragglers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + closedAddr(t), "http://" + closedAddr(t)}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 2
	cfg.EjectFor = time.Second
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	p, err := newPool(cfg, m, nil, clock.Now)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	o := p.origins[1]
	for range 2 + 20 {
		p.failed(o, "request")
	}
	require.False(t, o.healthy.Load())
	require.Equal(t, clock.Now().Add(time.Second).UnixNano(), o.ejectedUntil.Load(), "one ejection of EjectFor")
	require.Equal(t, 1.0, gathered(t, reg)["edgeguard_origin_ejections_total{pool=default}"])

	clock.advance(time.Second)
	require.Same(t, o, p.pick(nil), "on probation")
	p.failed(o, "request")
	require.Equal(t, clock.Now().Add(2*time.Second).UnixNano(), o.ejectedUntil.Load(), "the failed probe: twice as long")
	p.failed(o, "request")
	require.Equal(t, clock.Now().Add(2*time.Second).UnixNano(), o.ejectedUntil.Load(), "a straggler changes nothing")
	require.Equal(t, 2.0, gathered(t, reg)["edgeguard_origin_ejections_total{pool=default}"])
	p.succeeded(o, "request")
	require.True(t, o.healthy.Load())
	require.Zero(t, o.ejectedUntil.Load())
}
