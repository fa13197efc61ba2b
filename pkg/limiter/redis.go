package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	Process(ctx context.Context, cmd redis.Cmder) error
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// RedisStore decides with the Lua scripts of package lua. All requests of one
// Take travel in one pipeline: one round trip per Redis node. Over a
// connection from AutoPipelined, a Take of one request shares its command
// with other Takes' (lanes.go).
type RedisStore struct {
	conn    RedisConn
	client  RedisClient
	prefix  string
	scripts []script // by Algorithm
	ids     *idSource
	batch   script // lua.Batch: many lone calls in one
	lanes   lanes
	loadMu  sync.Mutex
	sent    sentCounts
	clock   redisClock // Redis's clock, for takes' deadlines (redisclock.go)
	workers *workers   // the goroutines lanes drain on
}

// sentCounts counts the script commands the store sends to Redis (takes
// and refunds) and the script calls they carry: a batch is one command
// carrying many, a pipeline of n is n commands of one each.
type sentCounts struct{ commands, calls atomic.Int64 }

func (c *sentCounts) add(commands, calls int) {
	c.commands.Add(int64(commands))
	c.calls.Add(int64(calls))
}

// Sent reports the script commands the store has sent to Redis and the
// script calls (one per key taken or refunded) they carried.
func (s *RedisStore) Sent() (commands, calls int64) {
	return s.sent.commands.Load(), s.sent.calls.Load()
}

var _ Store = (*RedisStore)(nil)

// ErrNoScript means a script was still missing after it was loaded again.
var ErrNoScript = errors.New("limiter script not loaded")

// ErrRedisTooOld: the server is older than Redis 7.0, which the batch
// script needs (its allow-cross-slot-keys flag, Redis 7's script flags).
// The edge refuses to start rather than decide every multi-limit request
// in the fallback.
var ErrRedisTooOld = errors.New("redis 7.0 or later is required")

// checkVersion asks the server (in a Cluster, one of its nodes) its
// version: below 7, ErrRedisTooOld.
func checkVersion(ctx context.Context, c RedisClient) error {
	cmd := redis.NewStringCmd(ctx, "info", "server")
	if err := c.Process(ctx, cmd); err != nil {
		return fmt.Errorf("asking the redis version: %w", err)
	}
	v, major, ok := redisVersion(cmd.Val())
	if !ok {
		return nil // a server that does not say (a proxy, say): the script load decides
	}
	if major < 7 {
		return fmt.Errorf("%w (the server runs %s)", ErrRedisTooOld, v)
	}
	return nil
}

// redisVersion reads redis_version from INFO server.
func redisVersion(info string) (version string, major int, ok bool) {
	for _, line := range strings.Split(info, "\n") {
		v, found := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !found {
			continue
		}
		m, _, _ := strings.Cut(v, ".")
		n, err := strconv.Atoi(m)
		if err != nil {
			return v, 0, false
		}
		return v, n, true
	}
	return "", 0, false
}

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
	s := &RedisStore{conn: conn, client: conn.Client, prefix: keyPrefix, ids: newIDSource(), scripts: make([]script, len(algs)+1), workers: newWorkers()}
	for _, a := range algs {
		src, err := lua.Source(a.Spec().Script)
		if err != nil {
			return nil, err
		}
		s.scripts[a] = newScript(src)
	}
	var batch []lua.Alg
	for _, a := range algs {
		sp := a.Spec()
		n := len(s.argv("take", Limit{Algorithm: a}, time.Time{}, "", 0, 0, 0, false)) // as many as every call
		batch = append(batch, lua.Alg{Code: int(a), Name: sp.Script, Keys: len(sp.Keys), Args: n})
	}
	src, err := lua.Batch(batch)
	if err != nil {
		return nil, err
	}
	s.batch = newScript(src)
	s.lanes = lanes{s: s, by: map[string]*lane{}}
	return s, nil
}

// Load loads every script on every node (SCRIPT LOAD).
func (s *RedisStore) Load(ctx context.Context) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if err := checkVersion(ctx, s.client); err != nil {
		return err
	}
	for _, a := range limit.All() {
		if err := s.scripts[a].load(ctx, s.client, a.String()); err != nil {
			return err
		}
	}
	if err := s.batch.load(ctx, s.client, "batch"); err != nil {
		return err
	}
	// Without it takes carry no deadline until the background reading.
	_ = s.clock.measure(ctx, s.client)
	return nil
}

// Warm readies the store for its first calls, for a store across a slow
// link (another region's, global.go), where each step is a round trip:
// the scripts loaded and Redis's clock read (Load), then conns
// connections dialed and greeted on every master in each of the client's
// two pools (go-redis sends a lone command on its main pool, a pipeline
// on a pool of its own), as many at once, so a first call and the clock
// reading sent beside it (redisclock.go) each find one.
func (s *RedisStore) Warm(ctx context.Context, conns int) error {
	if err := s.Load(ctx); err != nil {
		return err
	}
	node := func(ctx context.Context, c *redis.Client) error {
		errs := make(chan error, 2*conns)
		for range conns {
			go func() { errs <- c.Ping(ctx).Err() }()
			go func() {
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Ping(ctx).Err() })
				errs <- err
			}()
		}
		var all []error
		for range 2 * conns {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
	switch c := s.conn.Client.(type) {
	case *redis.Client:
		return node(ctx, c)
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, node)
	}
	return nil
}

// Keys returns the Redis keys that hold a limit's state. All share the hash
// tag {Key}, so one script call stays in one slot; the algorithm is part of
// the name so a rule that changes algorithm never meets WRONGTYPE.
func (s *RedisStore) Keys(l Limit) []string {
	suffixes := l.Algorithm.Spec().Keys
	keys := make([]string, len(suffixes))
	for i, k := range suffixes {
		keys[i] = s.prefix + "{" + l.Key + "}:" + k // one allocation a key
	}
	return keys
}

// takeOne is the state of a Take of one request, allocated at once.
type takeOne struct {
	out   [1]Decision
	errs  [1]error
	calls [1]call
	ids   [1]string
	cmds  [1]*redis.Cmd
}

// call is one script invocation: its algorithm, keys and arguments.
type call struct {
	alg     Algorithm
	keys    []string
	args    []any
	restore bool  // a Request.Restore: only the batch script runs it
	work    int64 // what it may write: the units of a member-keeping take, else 1
	// windowEnds: the call's bound is its Request.until, so a refusal
	// past it means the window ended (errWindowEnded).
	windowEnds bool
}

// argv is a script call's ARGV (prelude.lua's order): the member id and the
// first member's index only for the algorithms that keep members; for a
// tallied window (fixed or sliding), whether the call is tallied as made after a sign of a
// master change (post; fixed_window.lua).
func (s *RedisStore) argv(mode string, l Limit, at time.Time, id string, units, aux, first int64, post bool) []any {
	var now int64
	if !at.IsZero() {
		now = at.UnixMicro()
	}
	a := limit.ArgsFor(l, now)
	if id == "" {
		id = "-"
	}
	if l.Algorithm.Spec().Tallied {
		return []any{mode, now, a.Limit, a.Window, a.Extra, units, aux, postArg(post)}
	}
	if !l.Algorithm.Spec().Members {
		return []any{mode, now, a.Limit, a.Window, a.Extra, units, aux}
	}
	return []any{mode, now, a.Limit, a.Window, a.Extra, units, aux, id, first}
}

func postArg(post bool) string {
	if post {
		return "1"
	}
	return "0"
}

// takeCall is the script call that takes r; id names its members.
func (s *RedisStore) takeCall(r Request, id string) call {
	c := call{alg: r.Limit.Algorithm, keys: s.Keys(r.Limit), restore: r.Restore, work: 1}
	if r.Limit.Algorithm.Spec().Members {
		c.work = r.Cost // one ZSET member per unit
	}
	switch {
	case r.Peek:
		c.args = s.argv("take", r.Limit, r.At, id, 0, 1, 1, false) // a cost of 0 writes nothing
	case r.Restore:
		// One argument more, after the algorithm's: who gave the answer
		// restored (lua.Batch).
		c.args = append(s.argv("take", r.Limit, r.At, id, r.Cost, r.Remaining, 1, false), r.ident.String())
	default:
		c.args = s.argv("take", r.Limit, r.At, id, r.Cost, r.need(), 1, r.post)
	}
	return c
}

// Take implements Store.
func (s *RedisStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	return s.TakeRiding(ctx, reqs, nil)
}

// TakeRiding is Take with r, if not nil and not sent yet, riding in the
// pipeline of its calls (rider.go).
func (s *RedisStore) TakeRiding(ctx context.Context, reqs []Request, r *Rider) ([]Decision, error) {
	t, one := newTakeState(len(reqs))
	// ids and cmds stay out of t: slices of their own stay on the stack.
	var ids []string
	var cmds []*redis.Cmd
	if one != nil {
		ids, cmds = one.ids[:], one.cmds[:]
	} else {
		ids, cmds = make([]string, len(reqs)), make([]*redis.Cmd, len(reqs))
	}
	s.prepareTake(ctx, reqs, t, ids)
	// Restores go first, each as a call of the batch script on its key's
	// master (rare: once per key after an outage), so the requests after
	// them find the state restored.
	for i, c := range t.calls {
		if t.errs[i] == nil && c.restore {
			cmds[i] = s.restoreCmd(ctx, c)
		}
	}
	s.run(ctx, t.calls, t.errs, cmds, r)
	failed := false
	for i, r := range reqs {
		if t.errs[i] == nil {
			t.out[i], t.errs[i] = reply(r, ids[i], cmds[i])
			if t.calls[i].windowEnds && errors.Is(t.errs[i], errPastDeadline) {
				t.errs[i] = fmt.Errorf("%w: %w", errWindowEnded, t.errs[i])
			}
		}
		failed = failed || t.errs[i] != nil
	}
	if failed {
		return t.out, &TakeError{Errs: t.errs}
	}
	return t.out, nil
}

// takeState is a Take's answers, errors and script calls, one per request.
type takeState struct {
	out   []Decision
	errs  []error
	calls []call
}

func newTakeState(n int) (takeState, *takeOne) {
	if n == 1 { // most Takes: one allocation for their state
		one := new(takeOne)
		return takeState{one.out[:], one.errs[:], one.calls[:]}, one
	}
	return takeState{make([]Decision, n), make([]error, n), make([]call, n)}, nil
}

// prepareTake validates reqs and builds their script calls. A take
// decided on Redis's clock runs no later than its caller's deadline
// (redisclock.go); a restore runs at its own time.
func (s *RedisStore) prepareTake(ctx context.Context, reqs []Request, t takeState, ids []string) {
	var latest int64
	if d, ok := waitOf(ctx).Deadline(); ok {
		latest = s.clock.latest(d, s.client)
	}
	for i, r := range reqs {
		if t.errs[i] = r.valid(); t.errs[i] != nil {
			continue
		}
		if r.Limit.Algorithm.Spec().Members {
			ids[i] = s.ids.next()
		}
		if r.At.IsZero() && r.dated {
			r.At = s.clock.onRedis(r.admitted())
		}
		t.calls[i] = s.takeCall(r, ids[i])
		if r.At.IsZero() && !r.Restore {
			l, ended := untilLatest(r, latest)
			t.calls[i].args = withLatest(t.calls[i].args, l)
			t.calls[i].windowEnds = ended
		}
	}
}

// reply reads a take script's reply to r (id names its members).
func reply(r Request, id string, cmd *redis.Cmd) (Decision, error) {
	if r.post {
		if d, ok := tallied(r, cmd); ok {
			return d, nil
		}
	}
	v, err := cmd.Int64Slice()
	if err == nil && len(v) != 5 {
		err = fmt.Errorf("script returned %d values, want 5", len(v))
	}
	if err == nil {
		return decision(r, id, limit.Result{Admitted: v[0], Remaining: v[1], ResetMs: v[2], RetryMs: v[3], State: v[4]}), nil
	}
	var d Decision
	if r.Limit.Algorithm.Spec().Members && !r.Restore && maybeRan(err) {
		// The reply was lost, not the call: it may have added its
		// members. Their ids are known, so the caller can remove them
		// whether or not it ran (Decision.Unsure).
		d = Decision{Unsure: true, Lease: Lease{Limit: r.Limit, id: id, first: 1, Units: r.Cost}}
	}
	if pastDeadline(err) {
		err = fmt.Errorf("%w: %w", errPastDeadline, err)
	}
	return d, fmt.Errorf("taking %s: %w", r.Limit.Algorithm, err)
}

// tallied reads a tallied take's reply (Request.post): the five values
// of every take, and who ran it (tally.lua), which its lease keeps
// (Lease.id) and its answer is noted with: in the moments of a master
// change an edge's calls may reach either master, whatever its last
// identity read says.
func tallied(r Request, cmd *redis.Cmd) (Decision, bool) {
	vals, ok := cmd.Val().([]any)
	if cmd.Err() != nil || !ok || len(vals) != 6 {
		return Decision{}, false
	}
	var v [5]int64
	for i := range v {
		if v[i], ok = vals[i].(int64); !ok {
			return Decision{}, false
		}
	}
	ran, _ := vals[5].(string)
	return decision(r, ran, limit.Result{Admitted: v[0], Remaining: v[1], ResetMs: v[2], RetryMs: v[3], State: v[4]}), true
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
		calls = append(calls, call{alg: l.Limit.Algorithm, keys: s.Keys(l.Limit), args: s.argv("refund", l.Limit, time.Time{}, l.id, l.Units, l.state, l.first, l.tallied())})
	}
	errs := make([]error, len(calls))
	cmds := make([]*redis.Cmd, len(calls))
	s.run(ctx, calls, errs, cmds, nil)
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

// run sends calls (skipping those with an error already) in one pipeline,
// filling cmds, with r riding in it if it has not left yet; commands that
// meet NOSCRIPT go again once the scripts are loaded (againAfterLoad).
func (s *RedisStore) run(ctx context.Context, calls []call, errs []error, cmds []*redis.Cmd, r *Rider) {
	s.againAfterLoad(ctx, cmds,
		func(want func(int) bool) { s.exec(ctx, calls, errs, cmds, want, r) },
		func(i int, err error) { errs[i] = err })
}

// identity implements identifier: the identity (lua.Identity) of the
// master serving l's keys, as the batch script reads it.
func (s *RedisStore) identity(ctx context.Context, l Limit) (string, error) {
	client, err := s.masterOf(ctx, s.Keys(l)[0])
	if err != nil {
		return "", err
	}
	pipe := client.Pipeline()
	server, repl := pipe.Info(ctx, "server"), pipe.Info(ctx, "replication")
	if _, err := pipe.Exec(ctx); err != nil {
		return "", err
	}
	return lua.Identity(server.Val(), repl.Val()), nil
}

// masterOf is the client of the master serving key: the store's own, or a
// Cluster's node.
func (s *RedisStore) masterOf(ctx context.Context, key string) (RedisClient, error) {
	if s.conn.Node == nil {
		return s.client, nil
	}
	return s.conn.Node(ctx, key)
}

// restoreCmd runs a restore on the master serving its key.
func (s *RedisStore) restoreCmd(ctx context.Context, c call) *redis.Cmd {
	client, err := s.masterOf(ctx, c.keys[0])
	if err != nil {
		return failedCmd(ctx, err)
	}
	return s.batched(ctx, client, []call{c}, nil)[0]
}

func (s *RedisStore) exec(ctx context.Context, calls []call, errs []error, cmds []*redis.Cmd, want func(int) bool, r *Rider) {
	var sent []int
	for i := range calls {
		if errs[i] == nil && !calls[i].restore && want(i) {
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return
	}
	if r.leaves() {
		s.execRiding(ctx, r, calls, cmds, sent) // rider.go
		return
	}
	if len(sent) == 1 {
		// A lone call goes on its master's lane (lanes.go): at once with
		// few in flight, else in the lane's next batch. Several calls keep
		// a pipeline of their own: one round trip per node.
		i := sent[0]
		if s.conn.Lanes {
			if l := s.lanes.lane(ctx, calls[i].keys[0]); l != nil {
				cmds[i] = l.do(ctx, calls[i], nil)
				return
			}
		}
		cmds[i] = s.direct(ctx, calls[i])
		return
	}
	if s.conn.Node == nil {
		// One master holds every key: the calls go as one call of the
		// batch script (one command instead of one per call).
		cs := make([]call, len(sent))
		for j, i := range sent {
			cs[j] = calls[i]
		}
		for j, cmd := range s.batched(ctx, s.client, cs, nil) {
			cmds[sent[j]] = cmd
		}
		return
	}
	pcmds := make([]*redis.Cmd, len(sent))
	for j, i := range sent {
		c := calls[i]
		cmds[i] = evalShaCmd(ctx, s.scripts[c.alg], c.keys, c.args)
		pcmds[j] = cmds[i]
	}
	_ = s.pipeline(ctx, pcmds, len(pcmds))
}

// loneDirect is how many calls or batches a lane has in flight at most.
// A call that finds a place free and nobody waiting goes at once; the others
// wait for the next place, and leave together. Fewer places make deeper
// batches at saturation (one call of the batch script costs Redis 2–3 times
// less per decision than a lone script call, and the edge one write and one
// read per batch); more let a lightly loaded edge's calls go without waiting.
// Two served half the saturating rate with about the same added median as
// four and sent 0.28 instead of 0.46 script calls per decision to a Cluster
// at saturation (BENCHMARKS.md).
const loneDirect = 2
