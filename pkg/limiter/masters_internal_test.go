package limiter

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// addrConn is a connection that only names its remote address.
type addrConn struct {
	net.Conn
	addr string
}

func (c addrConn) RemoteAddr() net.Addr { return fakeAddr(c.addr) }

type fakeAddr string

// replyErr is an error reply from Redis.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

// The signs of a master change: a dial to another address, the first dial
// that succeeds after one failed, a MOVED or READONLY reply. Dials to the
// same address and other errors are none.
func TestWatchHookSigns(t *testing.T) {
	w := &masterWatch{}
	h := &watchHook{w: w}
	var to string
	var fail error
	dial := h.DialHook(func(context.Context, string, string) (net.Conn, error) {
		if fail != nil {
			return nil, fail
		}
		return addrConn{addr: to}, nil
	})
	ctx := context.Background()
	dialTo := func(addr string) {
		to = addr
		_, err := dial(ctx, "tcp", "ignored")
		require.NoError(t, err)
	}

	dialTo("10.0.0.1:6379")
	dialTo("10.0.0.1:6379")
	require.Zero(t, w.changes.Load(), "the first master, dialed again")
	dialTo("10.0.0.2:6379")
	require.EqualValues(t, 1, w.changes.Load(), "another address")
	fail = errors.New("connection refused")
	_, err := dial(ctx, "tcp", "ignored")
	require.Error(t, err)
	require.EqualValues(t, 1, w.changes.Load())
	fail = nil
	dialTo("10.0.0.2:6379")
	require.EqualValues(t, 2, w.changes.Load(), "answering again after a failed dial")
	dialTo("10.0.0.2:6379")
	require.EqualValues(t, 2, w.changes.Load())

	var reply error
	process := h.ProcessHook(func(context.Context, redis.Cmder) error { return reply })
	pipeline := h.ProcessPipelineHook(func(context.Context, []redis.Cmder) error { return reply })
	for _, e := range []error{nil, errors.New("EOF"), redis.ErrClosed, replyErr("ERR unknown command")} {
		reply = e
		_ = process(ctx, redis.NewCmd(ctx))
	}
	require.EqualValues(t, 2, w.changes.Load(), "no sign in a reply or a failed connection")
	reply = replyErr("MOVED 3999 127.0.0.1:6381")
	_ = process(ctx, redis.NewCmd(ctx))
	require.EqualValues(t, 3, w.changes.Load(), "MOVED")
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(replyErr("READONLY You can't write against a read only replica."))
	reply = nil
	_ = pipeline(ctx, []redis.Cmder{redis.NewCmd(ctx), cmd})
	require.EqualValues(t, 4, w.changes.Load(), "READONLY in a pipeline")
}

// A call sent before a master change and answered after it owes a restore
// of the answer before it less what it took, on top of a restore already
// owed, with the identity of the store that gave that answer (merged with
// another's: none); a key whose answer no longer speaks for its window owes
// nothing.
func TestLedgerOwesAcrossAMasterChange(t *testing.T) {
	lg := newLedger(1000)
	t0 := time.Unix(1_800_000_000, 0)
	a, b := &storeIdent{id: "a"}, &storeIdent{id: "b"}
	lg.observe("k", 40, t0, t0.Add(time.Hour), 1, 1, 1, false, a)
	_, _, _, _, ok := lg.lendRestore("k", t0)
	require.False(t, ok, "the same master: nothing owed")

	// Sent under generation 1, answered under 2 by a new master that
	// lacked 15: remaining 54 after taking 1.
	lg.observe("k", 54, t0.Add(time.Second), t0.Add(time.Hour), 1, 2, 1, false, b)
	rem, at, _, by, ok := lg.lendRestore("k", t0.Add(time.Second))
	require.True(t, ok)
	require.EqualValues(t, 39, rem, "the answer before it less what it took")
	require.Equal(t, t0, at)
	require.Equal(t, "a", by.String(), "who gave the answer owed back")

	// Another change: the last answer is owed, by who gave it; a key past
	// its window is not.
	lg.observe("old", 10, t0, t0.Add(time.Minute), 2, 2, 1, false, nil)
	lg.markAllMoved(3, t0.Add(2*time.Minute))
	rem, _, _, by, ok = lg.lendRestore("k", t0.Add(2*time.Minute))
	require.True(t, ok)
	require.EqualValues(t, 54, rem)
	require.Equal(t, "b", by.String())
	_, _, _, _, ok = lg.lendRestore("old", t0.Add(2*time.Minute))
	require.False(t, ok)
	require.Zero(t, lg.owing.Load())

	// Two answers owed at once, given by two stores: the restore keeps
	// the least remaining, and no identity.
	lg.oweRestore("k", 30, t0, t0.Add(time.Hour), a)
	lg.oweRestore("k", 20, t0, t0.Add(time.Hour), b)
	rem, _, _, by, ok = lg.lendRestore("k", t0.Add(3*time.Minute))
	require.True(t, ok)
	require.EqualValues(t, 20, rem)
	require.Nil(t, by, "two stores: neither may vouch for the other's answer")
	lg.oweRestore("k", 30, t0, t0.Add(time.Hour), a)
	lg.oweRestore("k", 20, t0, t0.Add(time.Hour), &storeIdent{id: "a"})
	_, _, _, by, _ = lg.lendRestore("k", t0.Add(3*time.Minute))
	require.Equal(t, "a", by.String(), "the same id, read twice")
}

// orderKey tags a call's context for reorderedStore: "first" or "second".
type orderKey struct{}

// reorderedStore is a Redis store whose first two calls meet before they
// pick their shard (so both start before the shard's breaker exists), and
// run on Redis in the opposite order to the one their answers are heard
// in: the call tagged second runs first; the call tagged first then runs
// and is answered; the second is answered once the test has heard the
// first (heardFirst).
type reorderedStore struct {
	*RedisStore
	shards                atomic.Int32
	met                   chan struct{}
	secondRan, heardFirst chan struct{}
}

// await waits for ch, at most long enough that a broken order fails the
// test instead of hanging it.
func await(ch <-chan struct{}) {
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	}
}

func (s *reorderedStore) Shard(l Limit) string {
	if n := s.shards.Add(1); n <= 2 {
		if n == 2 {
			close(s.met)
		}
		await(s.met)
	}
	return s.RedisStore.Shard(l)
}

func (s *reorderedStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	switch ctx.Value(orderKey{}) {
	case "first":
		await(s.secondRan)
		return s.RedisStore.Take(ctx, reqs)
	case "second":
		ds, err := s.RedisStore.Take(ctx, reqs)
		close(s.secondRan)
		await(s.heardFirst)
		return ds, err
	}
	return s.RedisStore.Take(ctx, reqs)
}

// The first master a limiter sees replaces none: two calls for one key
// that race to it, and whose answers are heard in the other order than
// they ran, owe no restore (before, the breaker made for them counted as a
// master change both calls were sent before, and the one heard last owed
// the answer heard first less what it took: a unit nobody was admitted
// for, in 3 of 664 runs of TestGlobalPartitionAndHeal, three at once
// on a busy machine). A master seen after the first is still a sign of a change.
func TestFirstMasterIsNoChange(t *testing.T) {
	rs := standaloneStore(t)
	st := &reorderedStore{RedisStore: rs, met: make(chan struct{}), secondRan: make(chan struct{}), heardFirst: make(chan struct{})}
	l, err := New(st, Config{Timeout: 10 * time.Second}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)

	lm := lim("first-master", limit.FixedWindow, 100, time.Hour)
	at := time.Now() // one window for every call
	call := func(tag string) Decision {
		ctx := context.WithValue(context.Background(), orderKey{}, tag)
		ds, errs := l.call(ctx, []Request{{Limit: lm, Cost: 1, At: at}}, []string{memKey(lm)}, l.now(), nil)
		require.NoError(t, errs[0])
		return ds[0]
	}
	second := make(chan Decision, 1)
	go func() { second <- call("second") }()
	first := call("first")
	close(st.heardFirst)
	require.EqualValues(t, 99, (<-second).Remaining, "the call heard last ran first")
	require.EqualValues(t, 98, first.Remaining)

	third := call("")
	require.EqualValues(t, 97, third.Remaining, "three taken, three counted: nothing restored")
	require.Zero(t, testutil.ToFloat64(l.metrics.restores))

	gen := l.masterGen()
	l.breakers.get("another master")
	require.Equal(t, gen+1, l.masterGen(), "a master seen after the first is a sign of a change")
}

// Units owed again after their window ended (a replay that failed late)
// are dropped: merged with the debt made since, their window's end took
// that debt with them (its units never reached the store, which then
// admitted them again). Each admission keeps the end of its own window: a
// lot whose window ended is dropped alone, the later ones are lent with
// theirs.
func TestLedgerDebtOwedAfterItsWindow(t *testing.T) {
	lg := newLedger(64)
	t0 := time.UnixMilli(1_800_000_000_000)
	lg.owe("k", 3, t0.Add(1500*time.Millisecond), t0.Add(2*time.Second)) // this window's
	lg.owe("k", 2, t0.Add(1600*time.Millisecond), t0.Add(time.Second))   // the last one's, owed again late
	require.Equal(t, []debtLot{{3, t0.Add(2 * time.Second)}}, lg.lend("k", t0.Add(1700*time.Millisecond)))

	lg.owe("s", 3, t0, t0.Add(2500*time.Millisecond)) // a sliding window's, admitted 500 ms apart
	lg.owe("s", 2, t0, t0.Add(2*time.Second))
	require.Equal(t, []debtLot{{3, t0.Add(2500 * time.Millisecond)}}, lg.lend("s", t0.Add(2200*time.Millisecond)),
		"the earlier admitted left the window alone")
	require.Zero(t, lg.owing.Load())
}

// TestLedgerLots: each admission time is a lot of its own, replayed with
// its own end (dated when admitted), up to maxLots; past that, a lot never
// ends earlier than any of its units would. Units paid or refunded leave
// the earliest lots first, so none left is dated earlier than admitted.
func TestLedgerLots(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lg := newLedger(64)
	lg.owe("k", 1, at(521), at(1521))
	lg.owe("k", 1, at(616), at(1616))
	lg.owe("k", 1, at(748), at(1748))
	require.Equal(t, []debtLot{{1, at(1521)}, {1, at(1616)}, {1, at(1748)}}, lg.lend("k", at(900)))
	require.Nil(t, lg.lend("k", at(900)), "lent once")
	require.Zero(t, lg.owing.Load())

	// Past maxLots: a lot ending last joins the latest, which takes its
	// end; one ending before the latest joins the first lot ending after
	// it; one ending with a lot joins it.
	for i := range maxLots + 1 {
		lg.owe("m", 1, at(100*i), at(1000+100*i))
	}
	lg.owe("m", 2, at(150), at(1150))
	lg.owe("m", 5, at(200), at(1200))
	require.Equal(t, []debtLot{{1, at(1000)}, {1, at(1100)}, {2 + 1 + 5, at(1200)}, {2, at(1400)}}, lg.lend("m", at(500)))

	// Paid (a refund) from the earliest lots first.
	lg.owe("p", 2, at(0), at(1000))
	lg.owe("p", 2, at(300), at(1300))
	lg.paid("p", 3)
	require.Equal(t, []debtLot{{1, at(1300)}}, lg.lend("p", at(400)))
	lg.owe("q", 2, at(0), at(1000))
	lg.paid("q", 2)
	require.Nil(t, lg.lend("q", at(400)))
	require.Zero(t, lg.owing.Load())
}

// An overtaken call (sent before a sign of a master change, answered
// after): tallied, only the answer before it is owed, as the restore adds
// the tally; untallied and saying less remains than that answer less what
// it took, its own answer is owed with no identity (it may come from
// either master, and hold the tally already).
func TestLedgerOwesAroundATally(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	a := &storeIdent{id: "a"}
	for _, c := range []struct {
		name      string
		remaining int64
		tallied   bool
		want      int64
		by        string
	}{
		{"tallied", 54, true, 40, "a"},
		{"untallied, from a master that lacked the answer", 54, false, 39, "a"},
		{"untallied, saying less remains", 30, false, 30, ""},
	} {
		lg := newLedger(1000)
		lg.observe("k", 40, t0, t0.Add(time.Hour), 1, 1, 1, false, a)
		lg.observe("k", c.remaining, t0.Add(time.Second), t0.Add(time.Hour), 1, 2, 1, c.tallied, nil)
		rem, _, _, by, ok := lg.lendRestore("k", t0.Add(time.Second))
		require.True(t, ok, c.name)
		require.Equal(t, c.want, rem, c.name)
		require.Equal(t, c.by, by.String(), c.name)
	}
}

// A fixed or sliding window's takes are tallied after a sign of a master
// change in their window (reckoned a second early), for tallyFor; a
// bucket's for tallyFor, whatever its window; no other algorithm's.
func TestAfterChange(t *testing.T) {
	l, err := New(NewMemoryStore(), Config{}, nil, nil)
	require.NoError(t, err)
	defer l.Close()
	fw := Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 10, Window: time.Hour}
	t0 := time.Unix(1_800_000_000, 0).Truncate(time.Hour).Add(30 * time.Minute)
	require.False(t, l.afterChange(fw, t0), "no change seen")
	l.ledger.changed.Store(t0.UnixNano())
	require.True(t, l.afterChange(fw, t0))
	require.True(t, l.afterChange(fw, t0.Add(tallyFor-time.Millisecond)))
	require.False(t, l.afterChange(fw, t0.Add(tallyFor)), "past tallyFor")
	require.True(t, l.afterChange(Limit{Key: "k", Algorithm: limit.SlidingWindow, Limit: 10, Window: time.Hour}, t0))
	for _, a := range []limit.Algorithm{limit.SlidingLog, limit.Concurrency} {
		require.False(t, l.afterChange(Limit{Key: "k", Algorithm: a, Limit: 10, Window: time.Hour}, t0), a.String())
	}
	// A change half a second before a minute's window starts.
	minute := Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 10, Window: time.Minute}
	l.ledger.changed.Store(t0.Add(-500 * time.Millisecond).UnixNano())
	require.True(t, l.afterChange(minute, t0.Add(100*time.Millisecond)), "a second early: Redis's clock may be behind")
	require.False(t, l.afterChange(minute, t0.Add(time.Minute+100*time.Millisecond)), "a window that began after the change")
	for _, a := range []limit.Algorithm{limit.TokenBucket, limit.LeakyBucket} {
		second := Limit{Key: "k", Algorithm: a, Limit: 10, Window: time.Second}
		require.True(t, l.afterChange(second, t0.Add(30*time.Second)), "%s: a bucket has no window", a)
		require.False(t, l.afterChange(second, t0.Add(tallyFor)), "%s: past tallyFor", a)
	}
}
