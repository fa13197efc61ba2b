package limiter

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mode is how a region runs Redis.
type Mode string

// The Redis deployments a region can run.
const (
	ModeStandalone Mode = "standalone"
	ModeCluster    Mode = "cluster"
	ModeSentinel   Mode = "sentinel"
)

// ParseMode accepts "standalone", "cluster" or "sentinel"; "" is standalone.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeStandalone, nil
	case ModeStandalone, ModeCluster, ModeSentinel:
		return m, nil
	}
	return "", fmt.Errorf("unknown redis mode %q (want standalone, cluster or sentinel)", s)
}

// NewRedisClient builds a go-redis client from a go-redis URL:
//
//	redis://[user:password@]host:port[/db]           standalone
//	redis://[user:password@]h1:port?addr=h2:port     cluster seeds
//	redis://h1:26379?addr=h2:26379&master_name=mymaster&password=…   sentinel
//
// rediss:// turns on TLS. Context deadlines are always honoured
// (ContextTimeoutEnabled; go-redis otherwise waits ReadTimeout, 3 s by
// default), and commands are never retried: a retried script call whose first
// reply was lost would count twice, and the caller falls back instead.
// A refused connection fails at once (one dial attempt, not go-redis's five
// 100 ms apart): the caller's deadline is a few ms and the fallback is ready.
// The client does not connect until first used.
func NewRedisClient(rawURL string, mode Mode) (redis.UniversalClient, error) {
	if _, err := url.Parse(rawURL); err != nil || rawURL == "" {
		return nil, fmt.Errorf("parsing redis URL: %w", urlErr(rawURL, err))
	}
	switch mode {
	case ModeStandalone, "":
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parsing redis URL: %w", err)
		}
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
		o.DialerRetries = max(o.DialerRetries, 1)
		return redis.NewClient(o), nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parsing redis cluster URL: %w", err)
		}
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
		o.DialerRetries = max(o.DialerRetries, 1)
		if o.ClusterStateReloadInterval == 0 {
			o.ClusterStateReloadInterval = 5 * time.Second // a backstop; errors trigger a reload at once
		}
		return redis.NewClusterClient(o), nil
	case ModeSentinel:
		o, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parsing redis sentinel URL: %w", err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("parsing redis sentinel URL: master_name is required")
		}
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
		o.DialerRetries = max(o.DialerRetries, 1)
		return redis.NewFailoverClient(o), nil
	}
	_, err := ParseMode(string(mode))
	return nil, err
}

// AutoPipelined returns a RedisClient over c (a client NewRedisClient built:
// *redis.Client for standalone and Sentinel, *redis.ClusterClient) that hands
// a Take's or Refund's lone script call to go-redis's AutoPipeliner, which
// sends the calls of concurrent Takes together in one pipeline per node.
// Several calls of one Take keep their own pipeline: one round trip per node.
//
// With a hundred or more Takes in flight per client it decides 1.2–1.8× as
// many lone requests per second; a lone caller loses about a fifth of its
// rate, some 10 µs per call (BENCHMARKS.md, "Pipelining concurrent requests
// together"). A call still runs once its caller's deadline has passed (the
// batch runs on the autopipeliner's context, the deadline ends only the
// wait), as a call already written to a plain connection does; at most 16384
// calls wait, beyond that they fail at once.
//
// The autopipeliner is c's deferred one, shared with any other user of c's
// AsyncAutoPipeline. The func returned stops it; closing c stops it too.
func AutoPipelined(c redis.UniversalClient) (RedisClient, func() error, error) {
	o := redis.DefaultAutoPipelineOptions() // one batch in flight per shard: the deepest batches
	o.MaxQueuedCommands = 1 << 14
	var ap *redis.AutoPipeliner
	var err error
	switch cc := c.(type) {
	case *redis.Client:
		ap, err = cc.AsyncAutoPipelineWithOptions(o)
	case *redis.ClusterClient:
		ap, err = cc.AsyncAutoPipelineWithOptions(o)
	default:
		return nil, nil, fmt.Errorf("autopipelining needs a *redis.Client or *redis.ClusterClient, not %T", c)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("autopipelining: %w", err)
	}
	return &autoPipelined{c: c, ap: ap}, ap.Close, nil
}

// autoPipelined is c, with lone script calls submitted to ap (see
// RedisStore.exec).
type autoPipelined struct {
	c  redis.UniversalClient
	ap *redis.AutoPipeliner
}

func (a *autoPipelined) Pipeline() redis.Pipeliner { return a.c.Pipeline() }

func (a *autoPipelined) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return a.c.EvalSha(ctx, sha1, keys, args...)
}

func (a *autoPipelined) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return a.c.ScriptLoad(ctx, script)
}

// ReloadState keeps a Cluster's reload on connection errors (stateReloader).
func (a *autoPipelined) ReloadState(ctx context.Context) {
	if r, ok := a.c.(stateReloader); ok {
		r.ReloadState(ctx)
	}
}

// MasterForKey keeps the per-master breakers of a Cluster (Sharder).
func (a *autoPipelined) MasterForKey(ctx context.Context, key string) (*redis.Client, error) {
	if m, ok := a.c.(masterForKey); ok {
		return m.MasterForKey(ctx, key)
	}
	return nil, fmt.Errorf("not a cluster client")
}

func urlErr(raw string, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("empty URL %q", raw)
}
