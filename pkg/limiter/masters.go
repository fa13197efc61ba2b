package limiter

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Master changes. Replication is asynchronous: a promoted replica (a
// Sentinel's switch, a Cluster failover, a master killed) may lack the last
// increments its old master acknowledged. The edges that made them know
// them: their last answer per key (the ledger's remaining, as of seen). When
// the master serving a key may have changed, the limiter owes the store a
// restore of that answer for every key active in its window, sent first
// with the key's next call; the restore takes only what the store no longer
// holds, so a master that kept its state takes nothing.
//
// What says a master may have changed, without anything per call while it
// stays the same:
//
//   - a connection dialed to another address than the previous one (a
//     Sentinel client's new master), or the first dial that succeeds after
//     one failed (a killed master answering again, or its replacement);
//   - a MOVED or READONLY reply (a Cluster slot served by another node, a
//     demoted master);
//   - a master the limiter had not seen (breakers.onNew), after the first:
//     that one replaces none.
//
// Each bumps a generation. A call that starts after a bump, while the
// background sweep has not reached every key yet, marks its own key first;
// a call the bump overtook (its command went to the new master before the
// restore) owes a restore of the answer before it, less what it took, so
// what it admitted on the new master is counted on top of the old count.

// masterWatch counts the signs that a master may have changed.
type masterWatch struct{ changes atomic.Uint64 }

func (w *masterWatch) bump() { w.changes.Add(1) }

// watches keeps one watch per client: a client passed to Conn again (a
// store rebuilt on the same client) keeps its one hook.
var watches sync.Map // redis.UniversalClient → *masterWatch

// watchClient returns c's watch, hooking c (a Cluster: each node's client)
// on first use.
func watchClient(c redis.UniversalClient) *masterWatch {
	if w, ok := watches.Load(c); ok {
		return w.(*masterWatch)
	}
	w := &masterWatch{}
	if prev, loaded := watches.LoadOrStore(c, w); loaded {
		return prev.(*masterWatch)
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(&watchHook{w: w}) })
	} else {
		c.AddHook(&watchHook{w: w})
	}
	return w
}

// watchHook watches one client's dials and replies.
type watchHook struct {
	w          *masterWatch
	last       atomic.Pointer[string] // the address last dialed
	dialFailed atomic.Bool            // a dial failed since the last that succeeded
}

func (h *watchHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.dialFailed.Store(true)
			return conn, err
		}
		to := conn.RemoteAddr().String()
		prev := h.last.Swap(&to)
		if h.dialFailed.Swap(false) || (prev != nil && *prev != to) {
			h.w.bump()
		}
		// Replies owed when a switch closes the connection are still
		// read (softclose.go).
		return newSoftConn(conn, softCloseSeam.Load()), nil
	}
}

func (h *watchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && masterMoved(err) {
			h.w.bump()
		}
		return err
	}
}

func (h *watchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if e := c.Err(); e != nil && masterMoved(e) {
				h.w.bump()
				break
			}
		}
		return err
	}
}

// masterMoved reports a reply that says another node serves the key now.
func masterMoved(err error) bool {
	return moved(err) || redis.HasErrorPrefix(err, "READONLY")
}

// masterChanges implements masterWatcher.
func (s *RedisStore) masterChanges() uint64 {
	if s.conn.watch == nil {
		return 0
	}
	return s.conn.watch.changes.Load()
}

// masterWatcher is a store that counts the signs of a master change.
type masterWatcher interface{ masterChanges() uint64 }

// masterGen is the generation of the masters as this limiter knows them:
// it grows with every sign that one may have changed.
func (l *Limiter) masterGen() uint64 {
	g := l.newShards.Load()
	if l.watch != nil {
		g += l.watch.masterChanges()
	}
	return g
}

// checkMasters marks key's restore when a master may have changed since
// its last answer and the sweep has not reached it yet, and starts the
// sweep. While the masters stay the same it is one comparison.
func (l *Limiter) checkMasters(key string, now time.Time) {
	g := l.masterGen()
	if g == l.ledger.swept.Load() {
		return
	}
	l.ledger.changed.Store(now.UnixNano())
	l.ledger.markMoved(key, g, now)
	if l.ledger.sweeping.CompareAndSwap(false, true) {
		l.bg.Go(l.sweepMasters)
	}
}

// sweepMasters marks every active key's restore, up to the latest
// generation.
func (l *Limiter) sweepMasters() {
	for {
		g := l.masterGen()
		l.ledger.markAllMoved(g, l.now())
		l.ledger.swept.Store(g)
		l.ledger.sweeping.Store(false)
		if l.masterGen() == g || !l.ledger.sweeping.CompareAndSwap(false, true) {
			return
		}
	}
}

// afterChange reports whether a take of lim at now comes after a sign of a
// master change, within tallyFor of it and, for a window, in the sign's
// window: a window's or a bucket's take is then tallied for the server
// that runs it (Request.post). Another edge's restore of an answer from the
// old master adds that tally, instead of absorbing what this edge admitted
// on the new master before the restore came. The window is reckoned on
// this edge's clock, a second early: Redis's may differ. A bucket's level
// has no window: an answer restored speaks for a window from when it was
// given, which may be after this edge's sign (another edge still on the
// old master), so its takes are tallied for all of tallyFor.
func (l *Limiter) afterChange(lim Limit, now time.Time) bool {
	sp := lim.Algorithm.Spec()
	if !sp.Tallied {
		return false
	}
	changed := l.ledger.changed.Load()
	if changed == 0 || now.UnixNano()-changed >= int64(tallyFor) {
		return false
	}
	if sp.Bucket {
		return true
	}
	w := lim.Window.Nanoseconds()
	if w <= 0 {
		return false
	}
	start := now.UnixNano() - now.UnixNano()%w
	return changed >= start-int64(time.Second)
}

// tallyFor is how long after a sign of a master change an edge's takes are
// tallied. A tallied take costs Redis about twice an untallied one (two
// INFO reads and a hash write more), so not for the rest of an hour's
// window. The restores that could absorb what is admitted later ride the
// keys' next calls: an edge that has not called a key for a minute after
// the change holds an answer older than that, which the edges active on
// the old master since have most likely restored past.
const tallyFor = time.Minute
