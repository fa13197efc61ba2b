package limiter

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
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
// owed; a key whose answer no longer speaks for its window owes nothing.
func TestLedgerOwesAcrossAMasterChange(t *testing.T) {
	lg := newLedger(1000)
	t0 := time.Unix(1_800_000_000, 0)
	lg.observe("k", 40, t0, t0.Add(time.Hour), 1, 1, 1)
	_, _, _, ok := lg.lendRestore("k", t0)
	require.False(t, ok, "the same master: nothing owed")

	// Sent under generation 1, answered under 2 by a new master that
	// lacked 15: remaining 54 after taking 1.
	lg.observe("k", 54, t0.Add(time.Second), t0.Add(time.Hour), 1, 2, 1)
	rem, at, _, ok := lg.lendRestore("k", t0.Add(time.Second))
	require.True(t, ok)
	require.EqualValues(t, 39, rem, "the answer before it less what it took")
	require.Equal(t, t0, at)

	// Another change: the last answer is owed; a key past its window is not.
	lg.observe("old", 10, t0, t0.Add(time.Minute), 2, 2, 1)
	lg.markAllMoved(3, t0.Add(2*time.Minute))
	rem, _, _, ok = lg.lendRestore("k", t0.Add(2*time.Minute))
	require.True(t, ok)
	require.EqualValues(t, 54, rem)
	_, _, _, ok = lg.lendRestore("old", t0.Add(2*time.Minute))
	require.False(t, ok)
	require.Zero(t, lg.owing.Load())
}
