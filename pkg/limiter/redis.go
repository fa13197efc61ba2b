package limiter

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/lua"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// RedisClient is what RedisStore needs of a go-redis client; every
// redis.UniversalClient (standalone, Cluster, Sentinel) has it. On a Cluster,
// a pipeline is split per master and sent in parallel, and ScriptLoad reaches
// every shard.
type RedisClient interface {
	Pipeline() redis.Pipeliner
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// RedisStore decides with the Lua scripts of package lua. All requests of one
// Take travel in one pipeline: one round trip per Redis node. Over a client
// from AutoPipelined, a Take of one request shares its pipeline with other
// Takes'.
type RedisStore struct {
	conn    RedisConn
	client  RedisClient
	prefix  string
	scripts []script // by Algorithm
	ids     *idSource
	loadMu  sync.Mutex
	lone    atomic.Int64 // lone calls in flight (with conn.Batch)
}

type script struct{ src, sha string }

var _ Store = (*RedisStore)(nil)

// ErrNoScript means a script was still missing after it was loaded again.
var ErrNoScript = errors.New("limiter script not loaded")

// DefaultKeyPrefix starts every key the store writes.
const DefaultKeyPrefix = "eg:"

// NewRedisStore builds a store over conn without contacting Redis: an edge
// must start while Redis is down. Scripts load on first use (or Load).
// keyPrefix "" means DefaultKeyPrefix.
func NewRedisStore(conn RedisConn, keyPrefix string) (*RedisStore, error) {
	if keyPrefix == "" {
		keyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(keyPrefix, "{}") {
		return nil, fmt.Errorf("key prefix %q: braces would break the hash tag", keyPrefix)
	}
	algs := limit.All()
	s := &RedisStore{conn: conn, client: conn.Client, prefix: keyPrefix, ids: newIDSource(), scripts: make([]script, len(algs)+1)}
	for _, a := range algs {
		src, err := lua.Source(a.Spec().Script)
		if err != nil {
			return nil, err
		}
		sum := sha1.Sum([]byte(src))
		s.scripts[a] = script{src: src, sha: hex.EncodeToString(sum[:])}
	}
	return s, nil
}

// Load loads every script on every node (SCRIPT LOAD).
func (s *RedisStore) Load(ctx context.Context) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	for _, a := range limit.All() {
		sc := s.scripts[a]
		sha, err := s.client.ScriptLoad(ctx, sc.src).Result()
		if err != nil {
			return fmt.Errorf("loading %s script: %w", a, err)
		}
		if sha != sc.sha {
			return fmt.Errorf("loading %s script: redis returned sha %s, want %s", a, sha, sc.sha)
		}
	}
	return nil
}

// Keys returns the Redis keys that hold a limit's state. All share the hash
// tag {Key}, so one script call stays in one slot; the algorithm is part of
// the name so a rule that changes algorithm never meets WRONGTYPE.
func (s *RedisStore) Keys(l Limit) []string {
	base := s.prefix + "{" + l.Key + "}:"
	suffixes := l.Algorithm.Spec().Keys
	keys := make([]string, len(suffixes))
	for i, k := range suffixes {
		keys[i] = base + k
	}
	return keys
}

// call is one script invocation: its algorithm, keys and arguments.
type call struct {
	alg  Algorithm
	keys []string
	args []any
}

// argv is a script call's ARGV (prelude.lua's order): the member id and the
// first member's index only for the algorithms that keep members.
func (s *RedisStore) argv(mode string, l Limit, at time.Time, id string, units, aux, first int64) []any {
	var now int64
	if !at.IsZero() {
		now = at.UnixMicro()
	}
	a := limit.ArgsFor(l, now)
	if id == "" {
		id = "-"
	}
	if !l.Algorithm.Spec().Members {
		return []any{mode, now, a.Limit, a.Window, a.Extra, units, aux}
	}
	return []any{mode, now, a.Limit, a.Window, a.Extra, units, aux, id, first}
}

// Take implements Store.
func (s *RedisStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	out := make([]Decision, len(reqs))
	errs := make([]error, len(reqs))
	calls := make([]call, len(reqs))
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		if errs[i] = r.valid(); errs[i] != nil {
			continue
		}
		if r.Limit.Algorithm.Spec().Members {
			ids[i] = s.ids.next()
		}
		calls[i] = call{r.Limit.Algorithm, s.Keys(r.Limit), s.argv("take", r.Limit, r.At, ids[i], r.Cost, r.need(), 1)}
	}
	cmds := s.run(ctx, calls, errs)
	failed := false
	for i, r := range reqs {
		if errs[i] != nil {
			failed = true
			continue
		}
		v, err := cmds[i].Int64Slice()
		if err == nil && len(v) != 5 {
			err = fmt.Errorf("script returned %d values, want 5", len(v))
		}
		if err != nil {
			errs[i] = fmt.Errorf("taking %s: %w", r.Limit.Algorithm, err)
			failed = true
			continue
		}
		out[i] = decision(r, ids[i], limit.Outcome{Admitted: v[0], Remaining: v[1], ResetMs: v[2], RetryMs: v[3], State: v[4]})
	}
	if failed {
		return out, &TakeError{Errs: errs}
	}
	return out, nil
}

// Refund implements Store.
func (s *RedisStore) Refund(ctx context.Context, leases []Lease) error {
	calls := make([]call, 0, len(leases))
	for _, l := range leases {
		if l.Units <= 0 {
			continue
		}
		if err := l.Limit.Validate(); err != nil {
			return err
		}
		calls = append(calls, call{l.Limit.Algorithm, s.Keys(l.Limit), s.argv("refund", l.Limit, time.Time{}, l.id, l.Units, l.state, l.first)})
	}
	errs := make([]error, len(calls))
	cmds := s.run(ctx, calls, errs)
	for i := range calls {
		if errs[i] == nil {
			errs[i] = cmds[i].Err()
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("refunding %s: %w", calls[i].alg, errs[i])
		}
	}
	return errors.Join(errs...)
}

// run sends calls (skipping those with an error already) in one pipeline.
// Script caches vanish when a node restarts or fails over, so commands that
// meet NOSCRIPT are run again after loading the scripts — only those: the
// others have already counted.
func (s *RedisStore) run(ctx context.Context, calls []call, errs []error) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	s.exec(ctx, calls, errs, cmds, func(int) bool { return true })
	retry := func(i int) bool { return cmds[i] != nil && isNoScript(cmds[i].Err()) }
	again := false
	for i := range cmds {
		again = again || retry(i)
	}
	if !again {
		return cmds
	}
	if err := s.Load(ctx); err != nil {
		for i := range cmds {
			if retry(i) {
				errs[i] = fmt.Errorf("%w: %w", ErrNoScript, err)
			}
		}
		return cmds
	}
	s.exec(ctx, calls, errs, cmds, retry)
	for i := range cmds {
		if retry(i) {
			errs[i] = fmt.Errorf("%w after reload: %w", ErrNoScript, cmds[i].Err())
		}
	}
	return cmds
}

func (s *RedisStore) exec(ctx context.Context, calls []call, errs []error, cmds []*redis.Cmd, want func(int) bool) {
	var sent []int
	for i := range calls {
		if errs[i] == nil && want(i) {
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return
	}
	if r := riding(ctx); r != nil {
		s.execRiding(ctx, r, calls, cmds, sent) // rider.go
		return
	}
	if len(sent) == 1 {
		i := sent[0]
		// A lone call shares a pipeline with other Takes' calls once more
		// than loneDirect are in flight; with fewer, it goes at once: a
		// batch waits for the one ahead of it, a round trip that a lightly
		// loaded edge need not pay (BENCHMARKS.md). Several calls keep a
		// pipeline of their own: queued one by one, they could straddle two
		// of the autopipeliner's batches, two round trips.
		if s.conn.Batch != nil {
			n := s.lone.Add(1)
			defer s.lone.Add(-1)
			if n > loneDirect {
				cmds[i] = s.submit(ctx, s.conn.Batch, calls[i])
				s.maybeReload(cmds[i : i+1])
				return
			}
		}
		// A plain command: a Cluster client's pipeline starts a goroutine
		// per node even for one command, a fifth of an edge's CPU in the
		// profile (BENCHMARKS.md).
		c := calls[i]
		cmds[i] = s.client.EvalSha(ctx, s.scripts[c.alg].sha, c.keys, c.args...)
		if cmds[i].Err() != nil {
			s.maybeReload(cmds[i : i+1])
		}
		return
	}
	pipe := s.client.Pipeline()
	for _, i := range sent {
		c := calls[i]
		cmds[i] = pipe.EvalSha(ctx, s.scripts[c.alg].sha, c.keys, c.args...)
	}
	// Per-command errors are read from each command. A connection that fails
	// before the pipeline is written (a wrong password fails the handshake)
	// leaves its commands without reply or error: give them Exec's error.
	if _, err := pipe.Exec(ctx); err != nil {
		for _, i := range sent {
			if cmds[i].Err() == nil && cmds[i].Val() == nil {
				cmds[i].SetErr(err)
			}
		}
		s.maybeReload(cmds)
	}
}

// loneDirect is how many lone calls go straight to a connection at once
// before the next ones are batched. With one batch in flight per node, a
// batched call waits for the batch ahead: at half the saturating rate,
// batching every call that found another in flight added over a millisecond
// to the median request, sending up to four at once a fraction of one, for
// the same CPU per decision at saturation, where some thirty calls are in
// flight (BENCHMARKS.md).
const loneDirect = 4

// submit runs c on an AutoPipeliner's deferred face, which sends the calls
// that concurrent callers submit together, in one pipeline per node. The
// batch runs on the AutoPipeliner's own context, so ctx bounds only the wait:
// a call whose caller has given up still runs (and counts), as a call already
// written to a connection does.
func (s *RedisStore) submit(ctx context.Context, ap *redis.AutoPipeliner, c call) *redis.Cmd {
	args := make([]any, 0, 3+len(c.keys)+len(c.args))
	args = append(args, "evalsha", s.scripts[c.alg].sha, len(c.keys))
	for _, k := range c.keys {
		args = append(args, k)
	}
	cmd := redis.NewCmd(ctx, append(args, c.args...)...)
	cmd.SetFirstKeyPos(3)
	f := ap.Submit(ctx, cmd)
	if err := f.WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The batch may still fill cmd in at any moment: the caller reads
		// a settled copy instead.
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// maybeReload asks a Cluster for its slot map again after a connection
// error (go-redis coalesces the requests); see RedisConn.Reload.
func (s *RedisStore) maybeReload(cmds []*redis.Cmd) {
	if s.conn.Reload == nil {
		return
	}
	for _, c := range cmds {
		if c == nil || c.Err() == nil {
			continue
		}
		var rerr redis.Error
		if !errors.As(c.Err(), &rerr) {
			s.conn.Reload(context.Background())
			return
		}
	}
}

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
