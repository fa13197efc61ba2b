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
// A behaviour rider (rider.go) queues on its own master's lane and leaves
// with the lane's next command, in the same pipeline; with riders only, a
// free place sends them alone.
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
	riders   []*riding // riders waiting for the lane's next command
}

// riding is a rider queued on its master's lane; Reply gets cmd's reply.
type riding struct {
	ctx context.Context // its Take's, without the cancel: once queued it runs
	r   *Rider
	cmd *redis.Cmd
}

// load is what a place of a lane sends next: a call, a batch or nothing,
// with the riders waiting.
type load struct {
	ws []*waiter
	rs []*riding
}

func (b load) empty() bool { return len(b.ws) == 0 && len(b.rs) == 0 }

// waiter is a queued call; its command is set, then done is closed.
type waiter struct {
	ctx  context.Context // the call's
	wait context.Context // its caller's wait (waitOf)
	c    call
	cmd  *redis.Cmd
	done chan struct{}
}

// maxLaneBatch bounds one batch (the rest waits for the next).
const maxLaneBatch = 128

// maxBatchWork bounds the ZSET members one batch may add (a sliding log or
// concurrency take adds one per unit; a limit holds at most
// limit.MaxMembers): a script blocks Redis while it runs, and past
// busy-reply-threshold (5 s by default) Redis answers every other client
// BUSY. A call over the bound goes in a batch of its own.
const maxBatchWork = 10_000

// batchCut is how many of n calls, from the first, one batch carries: at
// least one, at most maxLaneBatch, and no more work than maxBatchWork.
func batchCut(n int, work func(i int) int64) int {
	k, sum := 0, int64(0)
	for k < n && k < maxLaneBatch {
		if k > 0 && sum+work(k) > maxBatchWork {
			break
		}
		sum += work(k)
		k++
	}
	return k
}

// maxLaneQueue bounds a lane's queue: while Redis is slow the queue could
// otherwise grow with every request until the breaker opens; past it a
// call fails at once (the limiter's fallback decides it), as go-redis's
// AutoPipeliner fails a call past its queue. Riders waiting are bounded
// the same way (past it a rider's Reply sees ErrLaneFull).
var maxLaneQueue = 1 << 14

// errNotSent is a call taken out of its lane's queue before it was sent.
var errNotSent = errors.New("left the queue unsent")

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
// in flight, else in the next batch. A caller that stops waiting (waitOf)
// while its call is still queued takes the call out, so it is never sent
// (the fallback decides it instead, and Redis must not count it too). A
// call already in a batch runs: under a Limiter, do then waits for the
// batch's answer (the limiter gives back what the call took); under a plain
// context it returns at once, and the call still counts, as a call written
// to a connection does.
//
// rd, when not nil, is a rider on the same master: it leaves with the call
// (or, when the call is taken out of the queue, with the lane's next
// command).
func (l *lane) do(ctx context.Context, c call, rd *riding) *redis.Cmd {
	l.mu.Lock()
	if l.inflight < loneDirect && len(l.queue) == 0 {
		l.inflight++
		rs := l.takeRiders(rd)
		l.mu.Unlock()
		cmd := l.direct(ctx, c, rs)
		if b := l.next(); !b.empty() {
			l.s.workers.run(func() { l.drain(b) })
		}
		return cmd
	}
	if len(l.queue) >= maxLaneQueue {
		l.mu.Unlock()
		if rd != nil {
			rd.cmd = failedCmd(rd.ctx, ErrLaneFull)
			l.s.settleRiders([]*riding{rd})
		}
		return failedCmd(ctx, ErrLaneFull)
	}
	if rd != nil {
		l.riders = append(l.riders, rd)
	}
	w := &waiter{ctx: ctx, wait: waitOf(ctx), c: c, done: make(chan struct{})}
	l.queue = append(l.queue, w)
	l.mu.Unlock()
	select {
	case <-w.done:
		return w.cmd
	case <-w.wait.Done():
		l.mu.Lock()
		i := slices.Index(l.queue, w)
		if i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
		}
		l.mu.Unlock()
		if i >= 0 || w.wait == ctx {
			return failedCmd(ctx, fmt.Errorf("%w: %w", errNotSent, w.wait.Err()))
		}
		select { // in a batch: its answer says what the call took
		case <-w.done:
			return w.cmd
		case <-ctx.Done():
			return failedCmd(ctx, ctx.Err())
		}
	}
}

// ride queues rd on the lane: it leaves with the lane's next command, or
// at once, alone, when a place is free. Nobody waits for it.
func (l *lane) ride(rd *riding) {
	l.mu.Lock()
	if len(l.riders) >= maxLaneQueue {
		l.mu.Unlock()
		rd.cmd = failedCmd(rd.ctx, ErrLaneFull)
		l.s.settleRiders([]*riding{rd})
		return
	}
	l.riders = append(l.riders, rd)
	if l.inflight < loneDirect {
		l.inflight++
		b := l.nextLocked()
		l.mu.Unlock()
		l.s.workers.run(func() { l.drain(b) })
		return
	}
	l.mu.Unlock()
}

// takeRiders takes the riders waiting (at most maxLaneBatch), and rd.
func (l *lane) takeRiders(rd *riding) []*riding {
	n := min(len(l.riders), maxLaneBatch)
	var rs []*riding
	if n > 0 {
		rs = slices.Clone(l.riders[:n])
		l.riders = slices.Clone(l.riders[n:])
	}
	if rd != nil {
		rs = append(rs, rd)
	}
	return rs
}

// next is what the in-flight place just freed does: the next batch from
// the queue with the riders waiting, or nothing when nothing waits (and
// the place is given up).
func (l *lane) next() load {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextLocked()
}

func (l *lane) nextLocked() load {
	var b load
	for len(l.queue) > 0 && len(b.ws) == 0 {
		n := batchCut(len(l.queue), func(i int) int64 { return l.queue[i].c.work })
		ws := slices.Clone(l.queue[:n])
		if n == len(l.queue) {
			l.queue = nil
		} else {
			l.queue = slices.Clone(l.queue[n:])
		}
		// A caller that gave up just now is not sent either.
		b.ws = slices.DeleteFunc(ws, func(w *waiter) bool {
			if w.wait.Err() != nil {
				w.cmd = failedCmd(w.ctx, fmt.Errorf("%w: %w", errNotSent, w.wait.Err()))
				close(w.done)
				return true
			}
			return false
		})
	}
	b.rs = l.takeRiders(nil)
	if b.empty() {
		l.inflight--
	}
	return b
}

// drain sends what waits on the place it holds while anything does.
func (l *lane) drain(b load) {
	for ; !b.empty(); b = l.next() {
		l.send(b)
	}
}

// send runs a batch and settles its waiters. The batch is not bound by its
// callers' deadlines (each bounds only its own wait, and a call in a batch
// runs once sent, like one written to a connection), but by the client's
// socket timeouts.
func (l *lane) send(b load) {
	ws := b.ws
	if len(ws) == 0 {
		l.s.sendRiders(l.client, b.rs)
		return
	}
	ctx := context.WithoutCancel(ws[0].ctx)
	if len(ws) == 1 {
		ws[0].cmd = l.direct(ctx, ws[0].c, b.rs)
		close(ws[0].done)
		return
	}
	cs := make([]call, len(ws))
	for i, w := range ws {
		cs[i] = w.c
	}
	l.s.lanes.batches.Add(1)
	l.s.lanes.batched.Add(int64(len(ws)))
	cmds := l.s.batched(ctx, l.client, cs, b.rs)
	for i, w := range ws {
		w.cmd = cmds[i]
		close(w.done)
	}
}

// batched runs calls as one call of the batch script on client (the master
// serving all their keys) and returns each call's command; riders rs, on
// the same master, go in the same pipeline. Script caches vanish when a
// node restarts or fails over: a batch that meets NOSCRIPT ran nothing, and
// is sent again after loading the scripts (without the riders, which ran).
func (s *RedisStore) batched(ctx context.Context, client RedisClient, cs []call, rs []*riding) []*redis.Cmd {
	if n := batchCut(len(cs), func(i int) int64 { return cs[i].work }); n < len(cs) { // one batch after another
		return append(s.batched(ctx, client, cs[:n], rs), s.batched(ctx, client, cs[n:], nil)...)
	}
	args := s.batchArgs(cs)
	var one [1]*redis.Cmd
	s.againAfterLoad(ctx, one[:], func(func(int) bool) {
		one[0] = redis.NewCmd(ctx, args...)
		if len(rs) == 0 {
			s.process(ctx, client, one[0], len(cs))
			return
		}
		_ = s.pipelineOn(ctx, client, append([]*redis.Cmd{one[0]}, riderCmds(rs)...), 1, len(cs))
		s.settleRiders(rs)
		rs = nil
	}, func(_ int, err error) { one[0].SetErr(err) })
	return s.unbatch(ctx, cs, one[0])
}

// batchArgs is the command that runs cs as one call of the batch script.
func (s *RedisStore) batchArgs(cs []call) []any {
	args := make([]any, 0, 4+len(cs)*10)
	args = append(args, "evalsha", s.batch.sha, 0, len(cs))
	for _, c := range cs {
		if c.restore {
			args = append(args, -int(c.alg))
		} else {
			args = append(args, int(c.alg))
		}
		for _, k := range c.keys {
			args = append(args, k)
		}
		args = append(args, c.args...)
	}
	return args
}

// unbatch splits the batch command's reply into one command per call.
func (s *RedisStore) unbatch(ctx context.Context, cs []call, cmd *redis.Cmd) []*redis.Cmd {
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
		return cmds
	}
	for i, c := range cs {
		switch err, isErr := out[i].(error); {
		case isErr && strings.Contains(err.Error(), "non local key") && !c.restore:
			// Its slot is moving: it wrote nothing, and the routed
			// plain call follows the slot. Not a restore: only the
			// batch script runs one (the plain script would take what
			// it may restore), so it fails and is owed again.
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

// direct sends c as a plain EVALSHA, with riders rs (on the lane's master)
// in the same pipeline on the master's own client. A call whose slot has
// just moved (MOVED or ASK: it ran nothing) goes again on the routed client.
func (l *lane) direct(ctx context.Context, c call, rs []*riding) *redis.Cmd {
	if len(rs) == 0 {
		return l.s.direct(ctx, c)
	}
	cmd := evalShaCmd(ctx, l.s.scripts[c.alg], c.keys, c.args)
	_ = l.s.pipelineOn(ctx, l.client, append([]*redis.Cmd{cmd}, riderCmds(rs)...), 1, 1)
	l.s.settleRiders(rs)
	if moved(cmd.Err()) {
		return l.s.direct(ctx, c)
	}
	return cmd
}

// direct sends one call as a plain EVALSHA: a Cluster client's pipeline
// starts a goroutine per node even for one command, a fifth of an edge's
// CPU in the profile (BENCHMARKS.md).
func (s *RedisStore) direct(ctx context.Context, c call) *redis.Cmd {
	cmd := evalShaCmd(ctx, s.scripts[c.alg], c.keys, c.args)
	s.process(ctx, s.client, cmd, 1)
	return cmd
}
