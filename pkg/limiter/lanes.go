package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Lanes: the decisions of concurrent lone Takes, batched by the store itself.
// Each Redis master has a lane. A call that finds fewer than loneDirect calls
// of its lane in flight and none waiting goes at once, as a plain EVALSHA of
// its algorithm's script; the others wait in the lane's queue, and whichever
// call or batch of the lane ends first sends everything queued as ONE call of
// the batch script (lua.Batch): one command, one reading of Redis's clock and
// one reply for the whole batch, instead of one script call per decision.
// Nothing waits on a timer: a batch leaves as soon as a place is free.
type lanes struct {
	s  *RedisStore
	mu sync.RWMutex
	by map[string]*lane // by master address ("" outside a Cluster)

	batches, batched atomic.Int64 // batch calls sent, and the calls in them
}

type lane struct {
	s      *RedisStore
	client RedisClient // the master's own client (batches name no key to route by)

	mu       sync.Mutex
	inflight int // calls and batches in flight
	queue    []*waiter
}

// waiter is a queued call; its command is set, then done is closed.
type waiter struct {
	ctx  context.Context
	c    call
	cmd  *redis.Cmd
	done chan struct{}
}

// maxLaneBatch bounds one batch (the rest waits for the next).
const maxLaneBatch = 128

// maxLaneQueue bounds a lane's queue: while Redis is slow the queue could
// otherwise grow with every request until the breaker opens; past it a
// call fails at once (the limiter's fallback decides it), as go-redis's
// AutoPipeliner fails a call past its queue.
var maxLaneQueue = 1 << 14

// ErrLaneFull means a call found its Redis master's queue full.
var ErrLaneFull = errors.New("limiter: too many calls waiting for one Redis master")

// lane returns the lane of the master serving key.
func (ls *lanes) lane(ctx context.Context, key string) *lane {
	addr, client := "", ls.s.client
	if ls.s.conn.Node != nil {
		node, err := ls.s.conn.Node(ctx, key)
		if err != nil || node == nil {
			return nil // the plain path reports it
		}
		addr, client = node.Options().Addr, node
	}
	ls.mu.RLock()
	l := ls.by[addr]
	ls.mu.RUnlock()
	if l != nil && l.client == client {
		return l
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l = ls.by[addr]; l == nil || l.client != client {
		l = &lane{s: ls.s, client: client}
		ls.by[addr] = l
	}
	return l
}

// do runs one lone call on the lane: at once while fewer than loneDirect are
// in flight, else in the next batch. ctx bounds the wait: a caller that
// gives up while its call is still queued takes the call out, so it is
// never sent (the fallback decides it instead, and Redis must not count it
// too); a call already in a batch still runs (and counts), as a call
// written to a connection does.
func (l *lane) do(ctx context.Context, c call) *redis.Cmd {
	l.mu.Lock()
	if l.inflight < loneDirect && len(l.queue) == 0 {
		l.inflight++
		l.mu.Unlock()
		cmd := l.s.direct(ctx, c)
		if ws := l.next(); ws != nil {
			go l.drain(ws)
		}
		return cmd
	}
	if len(l.queue) >= maxLaneQueue {
		l.mu.Unlock()
		return failedCmd(ctx, ErrLaneFull)
	}
	w := &waiter{ctx: ctx, c: c, done: make(chan struct{})}
	l.queue = append(l.queue, w)
	l.mu.Unlock()
	select {
	case <-w.done:
		return w.cmd
	case <-ctx.Done():
		l.mu.Lock()
		if i := slices.Index(l.queue, w); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
		}
		l.mu.Unlock()
		return failedCmd(ctx, ctx.Err())
	}
}

// next is what the in-flight place just freed does: the next batch from
// the queue, or nil when nothing waits (and the place is given up).
func (l *lane) next() []*waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextLocked()
}

func (l *lane) nextLocked() []*waiter {
	if len(l.queue) == 0 {
		l.inflight--
		return nil
	}
	n := min(len(l.queue), maxLaneBatch)
	ws := slices.Clone(l.queue[:n])
	if n == len(l.queue) {
		l.queue = nil
	} else {
		l.queue = slices.Clone(l.queue[n:])
	}
	// A caller that gave up just now is not sent either.
	ws = slices.DeleteFunc(ws, func(w *waiter) bool {
		if w.ctx.Err() != nil {
			w.cmd = failedCmd(w.ctx, w.ctx.Err())
			close(w.done)
			return true
		}
		return false
	})
	if len(ws) == 0 {
		if len(l.queue) == 0 {
			l.inflight--
			return nil
		}
		return l.nextLocked()
	}
	return ws
}

// drain sends batches on the place it holds while any are waiting.
func (l *lane) drain(ws []*waiter) {
	for ; ws != nil; ws = l.next() {
		l.send(ws)
	}
}

// send runs a batch and settles its waiters. The batch is not bound by its
// callers' deadlines (each bounds only its own wait, and a call in a batch
// runs once sent, like one written to a connection), but by the client's
// socket timeouts.
func (l *lane) send(ws []*waiter) {
	ctx := context.WithoutCancel(ws[0].ctx)
	if len(ws) == 1 {
		ws[0].cmd = l.s.direct(ctx, ws[0].c)
		close(ws[0].done)
		return
	}
	cs := make([]call, len(ws))
	for i, w := range ws {
		cs[i] = w.c
	}
	l.s.lanes.batches.Add(1)
	l.s.lanes.batched.Add(int64(len(ws)))
	cmds := l.s.batched(ctx, l.client, cs)
	for i, w := range ws {
		w.cmd = cmds[i]
		close(w.done)
	}
}

// batched runs calls as one call of the batch script on client (the master
// serving all their keys) and returns each call's command. Script caches
// vanish when a node restarts or fails over: a batch that meets NOSCRIPT
// ran nothing, and is sent again after loading the scripts.
func (s *RedisStore) batched(ctx context.Context, client RedisClient, cs []call) []*redis.Cmd {
	args := make([]any, 0, 4+len(cs)*10)
	args = append(args, "evalsha", s.batch.sha, 0, len(cs))
	for _, c := range cs {
		args = append(args, int(c.alg))
		for _, k := range c.keys {
			args = append(args, k)
		}
		args = append(args, c.args...)
	}
	cmd := redis.NewCmd(ctx, args...)
	s.sent.add(1, len(cs))
	_ = client.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		if err := s.Load(ctx); err != nil {
			cmd.SetErr(fmt.Errorf("%w: %w", ErrNoScript, err))
		} else {
			cmd = redis.NewCmd(ctx, args...)
			s.sent.add(1, len(cs))
			_ = client.Process(ctx, cmd)
		}
	}
	cmds := make([]*redis.Cmd, len(cs))
	out, ok := cmd.Val().([]any)
	err := cmd.Err()
	if err == nil && (!ok || len(out) != len(cs)) {
		err = fmt.Errorf("batch script: %d replies for %d calls", len(out), len(cs))
	}
	if err != nil {
		for i := range cmds {
			cmds[i] = failedCmd(ctx, err)
		}
		s.maybeReload([]*redis.Cmd{cmd})
		return cmds
	}
	for i, c := range cs {
		switch err, isErr := out[i].(error); {
		case isErr && strings.Contains(err.Error(), "non local key"):
			// Its slot is moving: it wrote nothing, and the routed
			// plain call follows the slot.
			cmds[i] = s.direct(ctx, c)
		case isErr:
			cmds[i] = failedCmd(ctx, err)
		default:
			cmds[i] = redis.NewCmd(ctx)
			cmds[i].SetVal(out[i])
		}
	}
	return cmds
}

// direct sends one call as a plain EVALSHA: a Cluster client's pipeline
// starts a goroutine per node even for one command, a fifth of an edge's
// CPU in the profile (BENCHMARKS.md).
func (s *RedisStore) direct(ctx context.Context, c call) *redis.Cmd {
	s.sent.add(1, 1)
	cmd := s.client.EvalSha(ctx, s.scripts[c.alg].sha, c.keys, c.args...)
	if cmd.Err() != nil {
		s.maybeReload([]*redis.Cmd{cmd})
	}
	return cmd
}
