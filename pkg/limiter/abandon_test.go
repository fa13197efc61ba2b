package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/faults"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A call written to Redis before its caller gave up still runs once Redis
// answers, while the caller's fallback decided the request too. The limiter
// waits for such a call in the background and gives back what it took, so
// Redis ends up counting only what clients were admitted. Two faults hold
// the calls past the limiter's deadline: replies that come back late (the
// call ran, its answer is slow), and Redis paused with calls written to a
// connection or queued in a lane's batch; for a counted limit and a held
// one, over a plain and an autopipelined connection.
func TestAbandonedCallIsGivenBack(t *testing.T) {
	for _, fault := range []string{"late replies", "pause"} {
		for _, auto := range []bool{false, true} {
			for _, alg := range []limiter.Algorithm{limit.FixedWindow, limit.SlidingLog, limit.Concurrency} {
				name := fault + "/" + map[bool]string{false: "plain", true: "autopipeline"}[auto] + "/" + alg.String()
				t.Run(name, func(t *testing.T) { abandon(t, fault, auto, alg) })
			}
		}
	}
}

func abandon(t *testing.T, fault string, auto bool, alg limiter.Algorithm) {
	slow := &slowReplies{}
	o := &redis.Options{Addr: standaloneSrv().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, Dialer: slow.dial}
	c := redis.NewClient(o)
	defer c.Close()
	conn := limiter.Conn(c)
	if auto {
		conn = autoPipelined(t, c)
	}
	st := connStore(t, conn)
	require.NoError(t, st.Load(ctx(t)))
	l, err := limiter.New(st, limiter.Config{Timeout: 50 * time.Millisecond, BreakerFailures: 1000}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	p := testenv.KeyPrefix(t)
	// Six keys, so that the lane's places fill and later calls wait in
	// its queue for a batch.
	lims := make([]limiter.Limit, 6)
	for i := range lims {
		lims[i] = limiter.Limit{Key: p + string(rune('a'+i)), Algorithm: alg, Limit: 5, Window: time.Hour}
	}
	switch fault {
	case "late replies":
		slow.delay.Store(int64(250 * time.Millisecond))
	case "pause":
		pauser := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr})
		defer pauser.Close()
		require.NoError(t, pauser.Do(ctx(t), "CLIENT", "PAUSE", 250, "ALL").Err())
	}
	var wg sync.WaitGroup
	var fellBack atomic.Int64
	for _, lim := range lims {
		wg.Go(func() {
			v, err := l.Decide(context.Background(), []limiter.Check{{Limit: lim, Cost: 1, Nodes: 1}})
			if err == nil && v.Checks[0].Source == limiter.SourceFallback {
				fellBack.Add(1)
			}
			// A held slot is released as the edge does once the
			// response is sent.
			l.Release(context.Background(), v)
		})
	}
	wg.Wait()
	require.EqualValues(t, len(lims), fellBack.Load(), "every call outlived the deadline")
	slow.delay.Store(0)
	// The calls end once Redis answers; Close waits for them.
	l.Close()
	for _, lim := range lims {
		// Redis counts nothing of the abandoned calls: a fresh take sees
		// the whole limit but its own unit (for a held limit: no slot
		// still taken).
		ds, err := st.Take(ctx(t), []limiter.Request{{Limit: lim, Cost: 1}})
		require.NoError(t, err)
		require.EqualValues(t, 4, ds[0].Remaining, "%s: Redis still counts an abandoned call", lim.Key)
	}
}

// slowReplies is a dialer whose connections hand over Redis's replies late
// while delay is set: the calls run, their answers arrive after the deadline.
type slowReplies struct{ delay atomic.Int64 }

func (d *slowReplies) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialWrapped(ctx, network, addr, func(c net.Conn) net.Conn { return &slowConn{Conn: c, d: d} })
}

// dialWrapped dials addr and hands the connection to wrap (a fault's conn).
func dialWrapped(ctx context.Context, network, addr string, wrap func(net.Conn) net.Conn) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return wrap(c), nil
}

type slowConn struct {
	net.Conn
	d        *slowReplies
	deadline atomic.Int64 // unix ns of the read deadline, 0 = none
}

func (c *slowConn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(0)
	if !t.IsZero() {
		c.deadline.Store(t.UnixNano())
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *slowConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *slowConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if d := c.d.delay.Load(); d > 0 && n > 0 {
		time.Sleep(time.Duration(d)) // the fault: the reply is on its way
		if dl := c.deadline.Load(); dl != 0 && time.Now().UnixNano() > dl {
			// The reply came too late for the reader's deadline: what
			// the connection would have said.
			return 0, os.ErrDeadlineExceeded
		}
	}
	return n, err
}

// cutAfterReply is a dialer whose armed connection lets the next script
// call reach Redis, reads Redis's reply, and then fails as a connection
// reset after the write would: the call ran, its caller never learns it.
type cutAfterReply struct {
	armed atomic.Bool
	cuts  atomic.Int64
}

func (d *cutAfterReply) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialWrapped(ctx, network, addr, func(c net.Conn) net.Conn { return &cutConn{Conn: c, d: d} })
}

type cutConn struct {
	net.Conn
	d      *cutAfterReply
	script bool
}

func (c *cutConn) Write(b []byte) (int, error) {
	if c.d.armed.Load() && strings.Contains(strings.ToLower(string(b)), "evalsha") {
		c.script = c.d.armed.CompareAndSwap(true, false)
	}
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	if !c.script {
		return c.Conn.Read(b)
	}
	// The reply proves the script ran; it is thrown away.
	if _, err := c.Conn.Read(b); err != nil {
		return 0, err
	}
	c.d.cuts.Add(1)
	_ = c.Conn.Close()
	return 0, io.ErrUnexpectedEOF
}

// A script call whose reply is lost may have run: sending it again would
// count it twice. go-redis's Cluster client retries a command after a
// connection error on its own (MaxRedirects, separate from MaxRetries);
// the store's script calls are marked not to be retried, so the caller sees
// the error (and falls back) and Redis counts the call once.
func TestScriptCallNotRetriedAfterLostReply(t *testing.T) {
	// Its counts are an hour's fixed window's: not across the hour.
	testenv.EarlyInWindow(time.Hour, 10*time.Second)
	cl := clusterSrv()
	for _, auto := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "autopipeline"}[auto]
		t.Run(name, func(t *testing.T) {
			d := &cutAfterReply{}
			o, err := redis.ParseClusterURL(cl.URL())
			require.NoError(t, err)
			o.ContextTimeoutEnabled, o.MaxRetries, o.Dialer = true, -1, d.dial
			c := redis.NewClusterClient(o)
			defer c.Close()
			conn := limiter.Conn(c)
			if auto {
				conn = autoPipelined(t, c)
			}
			st := connStore(t, conn)
			require.NoError(t, st.Load(ctx(t)))
			lim := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.FixedWindow, Limit: 10, Window: time.Hour}
			_, err = st.Take(ctx(t), []limiter.Request{{Limit: lim, Cost: 1}})
			require.NoError(t, err)
			d.armed.Store(true)
			_, err = st.Take(ctx(t), []limiter.Request{{Limit: lim, Cost: 1}})
			require.EqualValues(t, 1, d.cuts.Load(), "the reply was cut")
			require.Error(t, err, "a call whose reply was lost is an error, not a retry")
			ds, err := st.Take(ctx(t), []limiter.Request{{Limit: lim, Cost: 1}})
			require.NoError(t, err)
			require.EqualValues(t, 7, ds[0].Remaining, "three takes ran, each once")
		})
	}
}

// A restore asks a store to count at least what it reported before an
// outage: a store that kept its state takes nothing, an emptied one takes
// what is missing, and a second restore takes nothing. Every store, every
// algorithm that counts (a held limit gives its slots back instead). Every
// take is at one instant with 10 s left of its hour: a fixed window's key
// expires on Redis's clock when that hour ends.
func TestRestoreTakesOnlyWhatIsMissing(t *testing.T) {
	testenv.EarlyInWindow(time.Hour, 10*time.Second)
	at := time.Now()
	for _, s := range allStores(t) {
		for _, alg := range limit.All() {
			if alg.Spec().Held {
				continue
			}
			t.Run(s.name+"/"+alg.String(), func(t *testing.T) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t) + "kept", Algorithm: alg, Limit: 60, Window: time.Hour}
				take := func(l limiter.Limit, r limiter.Request) limiter.Decision {
					r.Limit, r.At = l, at
					ds, err := s.store.Take(ctx(t), []limiter.Request{r})
					require.NoError(t, err)
					return ds[0]
				}
				seen := take(l, limiter.Request{Cost: 25}).Remaining
				require.EqualValues(t, 35, seen)
				restore := limiter.Request{Cost: l.Capacity() - seen, Restore: true, Remaining: seen}
				for i := range 2 {
					d := take(l, restore)
					require.Zero(t, d.Admitted, "restore %d of a store that kept its count", i)
				}
				require.EqualValues(t, seen-1, take(l, limiter.Request{Cost: 1}).Remaining, "nothing counted twice")

				empty := l
				empty.Key = testenv.KeyPrefix(t) + "empty" // a store that lost the key
				require.EqualValues(t, 25, take(empty, restore).Admitted, "the emptied store relearns what it had")
				require.Zero(t, take(empty, restore).Admitted, "a second restore takes nothing")
				require.EqualValues(t, seen-1, take(empty, limiter.Request{Cost: 1}).Remaining)
			})
		}
	}
}

// A restore is dated when the answer it restores was given, and that can
// be before the key's last write: another edge's take since, or the window
// after the answer's (a restore that reached Redis after its window ended).
// A dated take counts as of its time and never undoes the newer state: a
// fixed window's key kept its TTL (the restore's window's end, a
// millisecond away, ended the key and this window's count with it), a
// sliding log its life in memory (the restore's units' end ended it), a
// sliding window the window it counts in (the restore, counted in the
// newer window, read that window's count as its own and took too little:
// 4 admitted where 2 fit), a leaky bucket its leak clock (set back to the restore's time, it leaked
// again what had leaked: 99 of 100 remaining where at most 69 can be).
func TestDatedRestoreKeepsNewerState(t *testing.T) {
	for _, s := range allStores(t) {
		take := func(t *testing.T, l limiter.Limit, r limiter.Request) limiter.Decision {
			r.Limit = l
			ds, err := s.store.Take(ctx(t), []limiter.Request{r})
			require.NoError(t, err)
			return ds[0]
		}
		t.Run(s.name+"/fixed_window", func(t *testing.T) {
			const w = 10 * time.Second
			testenv.EarlyInWindow(w, 5*time.Second)
			now := time.Now()
			l := limiter.Limit{Key: testenv.KeyPrefix(t) + "fw", Algorithm: limit.FixedWindow, Limit: 60, Window: w}
			require.EqualValues(t, 55, take(t, l, limiter.Request{Cost: 5, At: now}).Remaining)
			read := time.Now() // no later than Redis reads the TTL
			ttl := keyTTL(t, s, l)
			restore := limiter.Request{Cost: 20, Restore: true, Remaining: 40, At: now.Truncate(w).Add(-time.Millisecond)}
			take(t, l, restore)
			if ttl > 0 {
				require.GreaterOrEqual(t, keyTTL(t, s, l), ttl-time.Since(read)-time.Millisecond, "the restore shortened the key's life")
			}
			require.LessOrEqual(t, take(t, l, limiter.Request{Cost: 1, At: now}).Remaining, int64(54), "this window's count kept")
		})
		t.Run(s.name+"/sliding_log", func(t *testing.T) {
			// Windows of 10 s: Redis's TTLs run on its own clock from
			// each write, and a stall of the test must not outlast them.
			t1 := time.Now()
			l := limiter.Limit{Key: testenv.KeyPrefix(t) + "sl", Algorithm: limit.SlidingLog, Limit: 10, Window: 10 * time.Second}
			require.EqualValues(t, 5, take(t, l, limiter.Request{Cost: 5, At: t1}).Remaining)
			// An answer of 2 remaining 9 s before: it takes 3, which
			// leave the log 1 s after t1, the 5 10 s after it.
			require.EqualValues(t, 3, take(t, l, limiter.Request{Cost: 8, Restore: true, Remaining: 2, At: t1.Add(-9 * time.Second)}).Admitted)
			require.EqualValues(t, 4, take(t, l, limiter.Request{Cost: 1, At: t1.Add(2 * time.Second)}).Remaining, "the log outlives the restore's units")
		})
		t.Run(s.name+"/sliding_window", func(t *testing.T) {
			base := time.Now().Truncate(10 * time.Second).Add(-30 * time.Second)
			l := limiter.Limit{Key: testenv.KeyPrefix(t) + "sw", Algorithm: limit.SlidingWindow, Limit: 10, Window: 10 * time.Second}
			// A store that lacks the last window's count (a promoted
			// replica) has counted 3 in this one.
			take(t, l, limiter.Request{Cost: 3, At: base.Add(12 * time.Second)})
			// The answer restored said 4 remaining, 5 s into the last
			// window: 6 used then, all 6 missing.
			require.EqualValues(t, 6, take(t, l, limiter.Request{Cost: 6, Restore: true, Remaining: 4, At: base.Add(5 * time.Second)}).Admitted)
			// 3 s into this window the last one weighs 0.7: 6 × 0.7 + 3
			// leaves room for 2 (the restore counted in this window read
			// its 3 as the last window's, took 3, and left room for 4).
			require.EqualValues(t, 2, take(t, l, limiter.Request{Cost: 20, Need: 1, At: base.Add(13 * time.Second)}).Admitted)
		})
		t.Run(s.name+"/leaky_bucket", func(t *testing.T) {
			t0 := time.Now()
			// 100 per 100 s: the key's TTL (the level's time to leak)
			// stays tens of seconds, longer than any stall of the test.
			l := limiter.Limit{Key: testenv.KeyPrefix(t) + "lb", Algorithm: limit.LeakyBucket, Limit: 100, Window: 100 * time.Second}
			take(t, l, limiter.Request{Cost: 20, At: t0})
			// 50 s later the 20 have leaked: the level is 40.
			require.EqualValues(t, 60, take(t, l, limiter.Request{Cost: 40, At: t0.Add(50 * time.Second)}).Remaining)
			// An answer of 50 remaining at t0, restored: the level as of
			// 50 s says 60 remain, so it takes 10 (what it cannot tell
			// from a count that fell).
			take(t, l, limiter.Request{Cost: 50, Restore: true, Remaining: 50, At: t0})
			// 10 s more leak 10: at least 40 - 10 + 1 are held.
			require.LessOrEqual(t, take(t, l, limiter.Request{Cost: 1, At: t0.Add(60 * time.Second)}).Remaining, int64(69), "what leaked before the restore's time leaked again")
		})
	}
}

// keyTTL is the TTL of l's first key in a Redis store (0 for another store).
func keyTTL(t *testing.T, s namedStore, l limiter.Limit) time.Duration {
	rs, ok := s.store.(*limiter.RedisStore)
	if !ok {
		return 0
	}
	ttl, err := client(limiter.Mode(s.name)).PTTL(ctx(t), rs.Keys(l)[0]).Result()
	require.NoError(t, err)
	return ttl
}

// A take whose reply is lost to a connection cut may have run: for a
// concurrency slot (or a sliding-log unit) it added members Redis keeps
// until their TTL, while the caller's fallback decided the request. Their
// ids are known, so the limiter removes them in the background whether the
// take ran or not: the slot is free again once the request ends.
func TestLostReplyDoesNotLeakASlot(t *testing.T) {
	d := &cutAfterReply{}
	c := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, Dialer: d.dial})
	defer c.Close()
	st := connStore(t, limiter.Conn(c))
	require.NoError(t, st.Load(ctx(t)))
	reg := prometheus.NewRegistry()
	l, err := limiter.New(st, limiter.Config{}, reg, nil)
	require.NoError(t, err)
	lim := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.Concurrency, Limit: 1, Window: time.Minute}
	d.armed.Store(true)
	v, err := l.Decide(context.Background(), []limiter.Check{{Limit: lim, Cost: 1, Nodes: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 1, d.cuts.Load(), "the reply was cut")
	require.Equal(t, limiter.SourceFallback, v.Checks[0].Source, "the caller fell back")
	l.ReleaseAsync(v)
	l.Close() // waits for the background give-back
	require.Equal(t, 1.0, metric(t, reg, "edgeguard_limiter_unsure_takes_total"))
	n, err := client(limiter.ModeStandalone).ZCard(ctx(t), st.Keys(lim)[0]).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no slot left held in Redis")
}

// A call that reaches Redis after its caller stopped waiting (the link
// delays what the edge sends) refuses to run there: it carries its caller's
// deadline on Redis's clock. Run, it would record the request at the late
// time Redis ran it, and until its give-back a sliding log's min_interval
// would deny the client's next request, well spaced though it was. The
// caller's fallback decided the request; Redis counts nothing and nothing is
// left to give back. Plain and autopipelined (a lane's call), a sliding log
// with a min_interval and a concurrency slot.
func TestLateCallRefusedPastDeadline(t *testing.T) {
	for _, auto := range []bool{false, true} {
		for _, alg := range []limiter.Algorithm{limit.SlidingLog, limit.Concurrency} {
			name := map[bool]string{false: "plain", true: "autopipeline"}[auto] + "/" + alg.String()
			t.Run(name, func(t *testing.T) { lateCall(t, auto, alg) })
		}
	}
}

func lateCall(t *testing.T, auto bool, alg limiter.Algorithm) {
	n := faults.NewNet()
	defer n.Close()
	c := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, Dialer: n.Dial})
	defer c.Close()
	conn := limiter.Conn(c)
	if auto {
		conn = autoPipelined(t, c)
	}
	st := connStore(t, conn)
	require.NoError(t, st.Load(ctx(t))) // also reads Redis's clock
	reg := prometheus.NewRegistry()
	l, err := limiter.New(st, limiter.Config{Timeout: 50 * time.Millisecond, BreakerFailures: 1000}, reg, nil)
	require.NoError(t, err)
	lim := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: 5, Window: time.Hour}
	if alg.Spec().MinInterval {
		lim.MinInterval = 100 * time.Millisecond
	}
	// What the edge sends reaches Redis 300 ms late, far past the deadline.
	require.NoError(t, n.Add(faults.Toxic{Name: "late", Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 300}}))
	v, err := l.Decide(context.Background(), []limiter.Check{{Limit: lim, Cost: 1, Nodes: 1}})
	require.NoError(t, err)
	require.Equal(t, limiter.SourceFallback, v.Checks[0].Source, "the call outlived the deadline")
	l.Release(context.Background(), v)
	l.Close() // waits for the late call's answer
	n.Clear()
	require.Equal(t, 1.0, metric(t, reg, "edgeguard_limiter_late_calls_total"), "the call was answered late")
	require.Zero(t, metric(t, reg, "edgeguard_limiter_late_given_back_total"), "the late call took nothing: it did not run")
	m, err := client(limiter.ModeStandalone).ZCard(ctx(t), st.Keys(lim)[0]).Result()
	require.NoError(t, err)
	require.Zero(t, m, "Redis holds nothing of the late call")
	// A call in time still runs (the deadline is on Redis's clock, not
	// before it).
	ds, err := st.Take(ctx(t), []limiter.Request{{Limit: lim, Cost: 1}})
	require.NoError(t, err)
	require.True(t, ds[0].Allowed)
}

// A call its caller gave up on is given back once Redis answers it late.
// When that give-back fails (the link drops or resets what the edge sends
// just after the late answer came in), the member the call added (a
// concurrency slot, a sliding-log unit) must not stay in Redis until its
// TTL: members are removed by id, so the give-back is retried as a release
// is, and the slot is free once the link is back. Redis's reply is held
// until the caller has fallen back and the take has run; then what the edge
// sends is dropped and the reply let through, so the give-back is lost
// every time. The four cases wait out a late call's and a give-back's
// deadlines, each on a link and a key of its own: they run side by side.
func TestFailedLateGiveBackIsRetried(t *testing.T) {
	for _, auto := range []bool{false, true} {
		for _, alg := range []limiter.Algorithm{limit.Concurrency, limit.SlidingLog} {
			name := map[bool]string{false: "plain", true: "autopipeline"}[auto] + "/" + alg.String()
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				lateGiveBackLost(t, auto, alg)
			})
		}
	}
}

func lateGiveBackLost(t *testing.T, auto bool, alg limiter.Algorithm) {
	n := faults.NewNet()
	defer n.Close()
	c := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, Dialer: n.Dial})
	defer c.Close()
	conn := limiter.Conn(c)
	if auto {
		conn = autoPipelined(t, c)
	}
	st := connStore(t, conn)
	require.NoError(t, st.Load(ctx(t)))
	reg := prometheus.NewRegistry()
	// The default deadline (250 ms): a late call and a give-back each get
	// 2.5 s.
	l, err := limiter.New(st, limiter.Config{BreakerFailures: 1000}, reg, nil)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	lim := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: 5, Window: time.Hour}
	key := st.Keys(lim)[0]
	members := func(ctx context.Context) (int64, error) {
		return client(limiter.ModeStandalone).ZCard(ctx, key).Result()
	}

	require.NoError(t, n.Add(faults.Toxic{Name: "held", Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 60000}}))
	v, err := l.Decide(context.Background(), []limiter.Check{{Limit: lim, Cost: 1, Nodes: 1}})
	require.NoError(t, err)
	require.Equal(t, limiter.SourceFallback, v.Checks[0].Source, "the caller gave up on the held reply")
	l.ReleaseAsync(v) // the fallback's slot: given back at once
	require.NoError(t, proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, "the take to run in Redis", func(ctx context.Context) error {
		m, err := members(ctx)
		if err == nil && m != 1 {
			err = fmt.Errorf("%d members", m)
		}
		return err
	}))

	// The reply goes on; what the edge sends next (the give-back) is lost.
	require.NoError(t, n.Add(faults.Toxic{Name: "dropped", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}))
	require.NoError(t, n.Remove("held"))
	require.NoError(t, proc.PollEvery(testenv.Within(t, 15*time.Second), 10*time.Millisecond, "the late give-back to fail", func(context.Context) error {
		if metric(t, reg, "edgeguard_limiter_refund_errors_total") < 1 {
			return errors.New("no refund failed yet")
		}
		return nil
	}))
	require.NoError(t, n.Remove("dropped"))
	l.Close() // waits for the give-back's retries
	closed = true

	require.Equal(t, 1.0, metric(t, reg, "edgeguard_limiter_late_given_back_total"), "the late call was answered: it took a unit")
	require.Zero(t, metric(t, reg, "edgeguard_limiter_unsure_takes_total"), "the reply was not lost")
	m, err := members(ctx(t))
	require.NoError(t, err)
	require.Zero(t, m, "Redis still holds what the late call took")
}

// A take whose caller gave up at the store deadline may still run on Redis
// up to four deadlines after it was sent (the caller may wait that long on
// evidence of life: redisclock.go). Its sliding-log unit is then dated when
// it ran, and until its edge gives it back a min_interval counts from it:
// another edge's request, sent well after the one given up on, may be
// denied for the interval (not for the count). That lasts until the give
// back lands, and no longer: then the same request is admitted at once.
func TestLateTakeHoldsMinIntervalUntilGivenBack(t *testing.T) {
	n := faults.NewNet()
	defer n.Close()
	ca := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, Dialer: n.Dial})
	defer ca.Close()
	sa := connStore(t, limiter.Conn(ca))
	require.NoError(t, sa.Load(ctx(t))) // also reads Redis's clock
	rega := prometheus.NewRegistry()
	la, err := limiter.New(sa, limiter.Config{Timeout: 250 * time.Millisecond, BreakerFailures: 1000}, rega, nil)
	require.NoError(t, err)
	sb := connStore(t, limiter.Conn(client(limiter.ModeStandalone)))
	require.NoError(t, sb.Load(ctx(t)))
	lb, err := limiter.New(sb, limiter.Config{Timeout: 250 * time.Millisecond, BreakerFailures: 1000}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	defer lb.Close()
	lim := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: 400, Window: time.Hour, MinInterval: 500 * time.Millisecond}
	check := []limiter.Check{{Limit: lim, Cost: 1, Nodes: 2}}
	key := sa.Keys(lim)[0]
	direct := client(limiter.ModeStandalone)
	count := func() int64 {
		m, err := direct.ZCard(ctx(t), key).Result()
		require.NoError(t, err)
		return m
	}

	// Edge a has an answer for the key (so its fallback denies it: the
	// other edge may have counted it since), a min_interval ago.
	v, err := la.Decide(context.Background(), check)
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.NoError(t, proc.PollEvery(testenv.Within(t, 5*time.Second), 10*time.Millisecond, "the interval to pass", func(context.Context) error {
		// On Redis's clock, from the newest unit's score (µs).
		newest, err := direct.ZRangeWithScores(ctx(t), key, -1, -1).Result()
		if err != nil || len(newest) != 1 {
			return fmt.Errorf("reading the newest unit: %v %v", newest, err)
		}
		now, err := direct.Time(ctx(t)).Result()
		if err != nil {
			return err
		}
		if since := time.Duration(now.UnixMicro()-int64(newest[0].Score)) * time.Microsecond; since < lim.MinInterval {
			return fmt.Errorf("%v since the newest unit", since)
		}
		return nil
	}))
	held := count()

	// What a sends reaches Redis 400 ms late (past the 250 ms deadline,
	// within four), and its replies come 300 ms later still.
	require.NoError(t, n.Add(faults.Toxic{Name: "late", Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 400}}))
	require.NoError(t, n.Add(faults.Toxic{Name: "slow replies", Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 300}}))
	v, err = la.Decide(context.Background(), check)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceFallback, v.Checks[0].Source, "a gave up at the deadline")
	require.False(t, v.Allowed)
	require.NoError(t, proc.PollEvery(testenv.Within(t, 5*time.Second), time.Millisecond, "a's late take to run", func(context.Context) error {
		if count() == held {
			return errors.New("not yet")
		}
		return nil
	}))
	v, err = lb.Decide(context.Background(), check)
	require.NoError(t, err)
	if d := v.Checks[0]; !v.Allowed {
		t.Logf("b, while a's late take is held: denied by %v, %d remaining, retry after %v", d.Source, d.Remaining, d.RetryAfter)
		require.Equal(t, limiter.SourceStore, d.Source)
		require.Positive(t, d.Remaining, "denied for the interval, not the count")
		require.LessOrEqual(t, d.RetryAfter, lim.MinInterval, "denied for the interval, not the count")
	}

	la.Close() // waits for the late answer and its give back
	require.Equal(t, 1.0, metric(t, rega, "edgeguard_limiter_late_given_back_total"), "a's late take was given back")
	require.Equal(t, held, count(), "Redis holds nothing of a's late take")
	v, err = lb.Decide(context.Background(), check)
	require.NoError(t, err)
	require.True(t, v.Allowed, "once the late take is given back, its interval is gone: %+v", v.Checks[0])
	require.Equal(t, limiter.SourceStore, v.Checks[0].Source)
}
