package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// A restore owed after an outage asks the store for what this edge's last
// answer counted. The server that gave that answer, master all along, kept
// it, even where its count has fallen since by what another edge gave back:
// the restore takes nothing, and the units given back stay for clients. A
// server with another identity (a replica promoted in its place with none
// of the data) takes what the answer counted. On a real Redis: the
// identity the limiter reads and the one the batch script reads agree.
func TestRestoreTakesNothingFromTheStoreThatAnswered(t *testing.T) {
	srv, st := standaloneServer(t)
	l, err := New(st, Config{Timeout: 10 * time.Second}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)

	k := lim("ident", limit.FixedWindow, 10, time.Hour)
	decide := func() Decision { return storeDecision(t, l, k) }
	owe := func() { l.ledger.oweAnswer(memKey(k), l.now()) } // as an outage does

	// Another edge takes 2 (a call its caller will give up on).
	other, err := st.Take(context.Background(), []Request{{Limit: k, Cost: 2}})
	require.NoError(t, err)
	require.EqualValues(t, 2, other[0].Admitted)

	require.EqualValues(t, 7, decide().Remaining)
	l.bg.Wait() // the shard's identity, read after its first call
	id := l.breakers.get(st.Shard(k)).ident.Load()
	require.NotEmpty(t, id.String(), "the identity of the Redis serving the key")
	for want := int64(6); want >= 4; want-- {
		require.EqualValues(t, want, decide().Remaining)
	}

	// The other edge's late answer: its 2 go back. The store counts 4;
	// this edge's last answer said 6.
	require.NoError(t, st.Refund(context.Background(), []Lease{other[0].Lease}))
	owe()
	require.EqualValues(t, 5, decide().Remaining, "the same server: the restore took nothing, the 2 given back are for clients")
	require.EqualValues(t, 1, testutil.ToFloat64(l.metrics.restores), "the restore ran")

	// A replica promoted with none of it: the restore relearns the 5
	// this edge's last answer counted.
	require.NoError(t, srv.ComeBackEmpty(context.Background()))
	owe()
	require.EqualValues(t, 4, decide().Remaining, "another server: the restore took what the last answer counted")
	require.EqualValues(t, 2, testutil.ToFloat64(l.metrics.restores))
}

// storeDecision is l's decision on one unit of k, which the store made.
func storeDecision(t *testing.T, l *Limiter, k Limit) Decision {
	t.Helper()
	v, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
	require.NoError(t, err)
	require.Equal(t, SourceStore, v.Checks[0].Source)
	return v.Checks[0]
}

// An edge's first answers come before the identity read they start has
// ended: a fixed window's call then asks its script who ran it
// (Limiter.unattributed), so its answer is noted with that server all the
// same, and a restore of it there takes nothing of what another edge gave
// back since. On a real Redis, the read held until the end.
func TestAnswerBeforeTheIdentityReadSaysWhoRanIt(t *testing.T) {
	testenv.EarlyInWindow(time.Hour, 20*time.Second) // every count in one window
	_, st := standaloneServer(t)
	l, err := New(st, Config{Timeout: 10 * time.Second}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	held := make(chan struct{})
	t.Cleanup(func() { close(held) }) // before l.Close, which waits for the read
	l.idf = heldIdentity{st, held}

	k := lim("ident-first", limit.FixedWindow, 10, time.Hour)
	decide := func() Decision { return storeDecision(t, l, k) }
	other, err := st.Take(context.Background(), []Request{{Limit: k, Cost: 2}})
	require.NoError(t, err)
	require.EqualValues(t, 7, decide().Remaining)
	require.EqualValues(t, 6, decide().Remaining)
	require.Nil(t, l.breakers.get(st.Shard(k)).ident.Load(), "the identity read has not landed")

	// The other edge's 2 go back: the store counts 2, this edge's last
	// answer said 6 remained (a count of 4).
	require.NoError(t, st.Refund(context.Background(), []Lease{other[0].Lease}))
	l.ledger.oweAnswer(memKey(k), l.now()) // as an outage does
	require.EqualValues(t, 7, decide().Remaining, "the server that answered: the restore took nothing, the 2 given back are for clients")
	require.EqualValues(t, 1, testutil.ToFloat64(l.metrics.restores), "the restore ran")
}

// refusal is a Redis error reply (redis.Error).
type refusal string

func (r refusal) Error() string { return string(r) }
func (refusal) RedisError()     {}

// heldIdentity reads a store's identity once held is closed.
type heldIdentity struct {
	identifier
	held <-chan struct{}
}

func (h heldIdentity) identity(ctx context.Context, l Limit) (string, error) {
	select {
	case <-h.held:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return h.identifier.identity(ctx, l)
}

// An answer is noted with its shard's identity only when the identity was
// read before the call was sent, and no sign of a master change came
// since: a call sent as the read ended may have run before it, and after a
// sign the identity read says nothing of who answers.
func TestAnswerNotedWithAnIdentityReadBefore(t *testing.T) {
	b := &breaker{}
	t0 := time.Unix(1_800_000_000, 0)
	require.Nil(t, b.answeredBy(t0, 1), "nothing read yet")
	b.ident.Store(&storeIdent{id: "x", since: t0, gen: 1, tried: 1})
	require.Nil(t, b.answeredBy(t0, 1), "sent as the read ended")
	require.Equal(t, "x", b.answeredBy(t0.Add(time.Nanosecond), 1).String())
	require.Nil(t, b.answeredBy(t0.Add(time.Second), 2), "a sign of a master change since the read")
	b.ident.Store(&storeIdent{since: t0, gen: 1, tried: 1})
	require.Nil(t, b.answeredBy(t0.Add(time.Second), 1), "a store that could not say")
}

// identityStore is a memory store whose identity the test sets, and fails.
type identityStore struct {
	*MemoryStore
	id   string
	err  error
	read int
}

func (s *identityStore) identity(context.Context, Limit) (string, error) {
	s.read++
	return s.id, s.err
}

// A shard's identity is read at its first call, again after a sign of a
// master change, and not again while none comes (a read that failed
// included); a read with the same id keeps the time it was first known,
// and one that fails keeps what was known for the generation it was read
// under.
func TestIdentityReadOncePerGeneration(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	st := &identityStore{MemoryStore: NewMemoryStore(WithClock(clock.now)), id: "x"}
	l, err := New(st, Config{Now: clock.now}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	k := lim("reads", limit.FixedWindow, 100, time.Hour)
	decide := func() {
		t.Helper()
		_, err := l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}})
		require.NoError(t, err)
		l.bg.Wait()
	}
	b := l.breakers.get(st.Shard(k))
	decide()
	require.Equal(t, 1, st.read, "read at the shard's first call")
	first := b.ident.Load()
	require.Equal(t, "x", first.String())
	clock.add(time.Second)
	decide()
	decide()
	require.Equal(t, 1, st.read, "not again under the same generation")

	l.newShards.Add(1) // a sign of a master change
	decide()
	require.Equal(t, 2, st.read)
	require.Equal(t, first.since, b.ident.Load().since, "the same id: known since the first read")
	require.Equal(t, l.masterGen(), b.ident.Load().gen)

	st.err = context.DeadlineExceeded
	l.newShards.Add(1)
	decide()
	decide()
	require.Equal(t, 3, st.read, "a read that failed is not tried again before the next sign")
	now := b.ident.Load()
	require.Equal(t, "x", now.String(), "what was known stays")
	require.Equal(t, l.masterGen()-1, now.gen, "for the generation it was read under")
	require.Equal(t, l.masterGen(), now.tried)
	clock.add(identRetry)
	decide()
	require.Equal(t, 4, st.read, "a read that failed for a reason that may pass is tried again identRetry later")
	st.err = refusal("ERR unknown command 'INFO'")
	clock.add(identRetry)
	decide()
	require.Equal(t, 5, st.read)
	clock.add(identRetry)
	decide()
	require.Equal(t, 5, st.read, "a reply refusing INFO is not tried again before the next sign")

	st.err, st.id = nil, "y"
	l.newShards.Add(1)
	clock.add(time.Second)
	decide()
	require.Equal(t, "y", b.ident.Load().String())
	require.Equal(t, clock.now(), b.ident.Load().since, "a new id: known since this read")
}
