package limiter

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A Rider is a script call that travels in the pipeline a Take already
// sends, so that it costs no round trip of its own: the behaviour layer's
// signal update rides with a request's limit checks (Limiter.DecideRiding).
// The Take does not wait for it longer than for its own calls and never
// acts on its reply; Reply gets the reply once its batch has run (possibly
// on another goroutine, possibly after Decide returned). A Take carries at
// most one rider, once: Sent reports whether it left, so the caller can send
// what did not (a check denied by the over-limit cache, joined to another
// request's call, or decided without the store) some other way.
type Rider struct {
	Script *RiderScript
	Keys   []string
	Args   []any
	Reply  func(RiderReply)
	sent   atomic.Bool
}

// RiderReply is a rider script's reply, read as go-redis reads a command's.
type RiderReply struct{ cmd *redis.Cmd }

// Err is the error the script or its round trip met.
func (r RiderReply) Err() error { return r.cmd.Err() }

// Int64 reads an integer reply.
func (r RiderReply) Int64() (int64, error) { return r.cmd.Int64() }

// Int64Slice reads an array of integers.
func (r RiderReply) Int64Slice() ([]int64, error) { return r.cmd.Int64Slice() }

// RiderScript is a script riders run (EVALSHA). A rider that meets NOSCRIPT
// is not retried: its Reply sees the error, and Load puts the script back.
type RiderScript struct{ script }

// NewRiderScript prepares src.
func NewRiderScript(src string) *RiderScript { return &RiderScript{newScript(src)} }

// Load loads the script on every node.
func (s *RiderScript) Load(ctx context.Context, c RedisClient) error {
	return c.ScriptLoad(ctx, s.src).Err()
}

// IsNoScript reports whether err says the script is not loaded.
func IsNoScript(err error) bool { return isNoScript(err) }

// Sent reports whether the rider left with a Take.
func (r *Rider) Sent() bool { return r.sent.Load() }

// leaves reports whether r leaves now: the first time it is asked, and
// never for a nil rider.
func (r *Rider) leaves() bool { return r != nil && r.sent.CompareAndSwap(false, true) }

// riderStore is a store riders can travel with (RedisStore): TakeRiding is
// Take with r in its pipeline, if it sends one.
type riderStore interface {
	TakeRiding(ctx context.Context, reqs []Request, r *Rider) ([]Decision, error)
}

var _ riderStore = (*RedisStore)(nil)

func (s *RedisStore) riderCmd(ctx context.Context, r *Rider) *redis.Cmd {
	return evalShaCmd(ctx, r.Script.script, r.Keys, r.Args)
}

// execRiding is exec for sent calls with a rider: the rider joins their
// pipeline. With lanes, a lone call's rider queues on its own master's lane
// (lanes.go): on the call's master it leaves with the call; on another, with
// that lane's next command, and the Take does not wait for it.
func (s *RedisStore) execRiding(ctx context.Context, r *Rider, calls []call, cmds []*redis.Cmd, sent []int) {
	if s.conn.Lanes && len(sent) == 1 {
		i := sent[0]
		key := ""
		if len(r.Keys) > 0 {
			key = r.Keys[0]
		}
		own, with := s.lanes.lane(ctx, key), s.lanes.lane(ctx, calls[i].keys[0])
		if own != nil && with != nil {
			rd := &riding{ctx: context.WithoutCancel(ctx), r: r}
			rd.cmd = s.riderCmd(rd.ctx, r)
			if own == with {
				cmds[i] = with.do(ctx, calls[i], rd)
				return
			}
			own.ride(rd)
			cmds[i] = with.do(ctx, calls[i], nil)
			return
		}
	}
	rc := s.riderCmd(ctx, r)
	pcmds := make([]*redis.Cmd, 1, len(sent)+1)
	pcmds[0] = rc
	for _, i := range sent {
		c := calls[i]
		cmds[i] = evalShaCmd(ctx, s.scripts[c.alg], c.keys, c.args)
		pcmds = append(pcmds, cmds[i])
	}
	_ = s.pipeline(ctx, pcmds, len(sent))
	r.Reply(RiderReply{rc})
}

func riderCmds(rs []*riding) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(rs))
	for i, rd := range rs {
		cmds[i] = rd.cmd
	}
	return cmds
}

// sendRiders sends riders queued on a lane alone, in one pipeline on its
// master's client, and hands each its reply.
func (s *RedisStore) sendRiders(client RedisClient, rs []*riding) {
	_ = s.pipelineOn(rs[0].ctx, client, riderCmds(rs), 0, 0)
	s.settleRiders(rs)
}

// settleRiders hands each rider its reply. A rider whose slot has just
// moved (MOVED or ASK: it ran nothing) goes again on the routed client.
func (s *RedisStore) settleRiders(rs []*riding) {
	for _, rd := range rs {
		if moved(rd.cmd.Err()) {
			rd.cmd = s.riderCmd(rd.ctx, rd.r)
			_ = s.client.Process(rd.ctx, once{rd.cmd})
		}
		rd.r.Reply(RiderReply{rd.cmd})
	}
}

// moved reports whether err is a Cluster redirection: the command ran
// nothing, its slot is served by another node.
func moved(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}

// RunRiders sends riders on their own, in one pipeline (one round trip per
// node), and hands each its reply: what could not ride with a Take.
func (s *RedisStore) RunRiders(ctx context.Context, rs []*Rider) error {
	if len(rs) == 0 {
		return nil
	}
	cmds := make([]*redis.Cmd, len(rs))
	for i, r := range rs {
		r.sent.Store(true)
		cmds[i] = s.riderCmd(ctx, r)
	}
	err := s.pipeline(ctx, cmds, 0)
	for i, r := range rs {
		r.Reply(RiderReply{cmds[i]})
	}
	return err
}

// Client is the client the store runs on (to load a rider's script).
func (s *RedisStore) Client() RedisClient { return s.client }
