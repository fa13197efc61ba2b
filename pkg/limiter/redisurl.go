package limiter

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"slices"
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
// The client does not connect until first used. dial, when given, maps
// addresses to dial instead of them (see DialMap).
func NewRedisClient(rawURL string, mode Mode, dial ...DialMap) (redis.UniversalClient, error) {
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
		o.Dialer = dialer(dial, o.DialTimeout, o.TLSConfig)
		return redis.NewClient(o), nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parsing redis cluster URL: %w", err)
		}
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
		o.DialerRetries = max(o.DialerRetries, 1)
		o.Dialer = dialer(dial, o.DialTimeout, o.TLSConfig)
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
		o.Dialer = dialer(dial, o.DialTimeout, o.TLSConfig)
		return redis.NewFailoverClient(o), nil
	}
	_, err := ParseMode(string(mode))
	return nil, err
}

// DialMap maps a Redis address, as the URL, a Cluster's slot map or a
// Sentinel names it, to the address to connect to instead: a NAT, tunnel
// or proxy in front of each node, for a Redis whose nodes announce
// addresses the client cannot reach as such (another region's).
type DialMap map[string]string

// dialer is go-redis's own dialer (dial timeout, 5 min keep-alive, TLS
// when configured) with the addresses of the maps replaced; nil (go-redis's
// default) without a non-empty map.
func dialer(maps []DialMap, timeout time.Duration, tlsConf *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	maps = slices.DeleteFunc(slices.Clone(maps), func(m DialMap) bool { return len(m) == 0 })
	if len(maps) == 0 {
		return nil
	}
	if timeout == 0 {
		timeout = 5 * time.Second // go-redis's default
	}
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for _, m := range maps {
			if to, ok := m[addr]; ok {
				addr = to
				break
			}
		}
		if tlsConf == nil {
			return nd.DialContext(ctx, network, addr)
		}
		return (&tls.Dialer{NetDialer: nd, Config: tlsConf}).DialContext(ctx, network, addr)
	}
}

// RedisConn is what a RedisStore runs on: a client and the capabilities the
// store uses, declared when the connection is built rather than discovered
// from the client's type, so no wrapper can silently drop one.
type RedisConn struct {
	// Client runs the commands.
	Client RedisClient
	// Lanes, when set, batches lone script calls: the store's lanes
	// (lanes.go) send the decisions of concurrent Takes waiting for the
	// same master as one call of the batch script, and a behaviour rider
	// travels with the next command its own master's lane sends.
	Lanes bool
	// Node is the client of the Cluster master serving a key (a lane's
	// batch goes to it by name); nil outside a Cluster.
	Node func(ctx context.Context, key string) (*redis.Client, error)
	// Master names the Cluster master serving a key, so the limiter keeps a
	// breaker per master; nil outside a Cluster.
	Master func(ctx context.Context, key string) (string, error)
	// Reload refreshes a Cluster's slot map after a connection error: a
	// crashed master answers no MOVED, and the promoted replica is found as
	// soon as the map is read again. nil outside a Cluster.
	Reload func(ctx context.Context)
	// watch counts the client's signs of a master change (masters.go).
	watch *masterWatch
}

// Conn declares what a client NewRedisClient built offers the store: a
// *redis.ClusterClient routes by slot (per-master breakers, slot map
// reloads); standalone and Sentinel clients serve every key from one master.
// It hooks c (once per client) to learn when a master may have changed: the
// limiter then restores its last answers on the new one (masters.go).
func Conn(c redis.UniversalClient) RedisConn {
	conn := RedisConn{Client: c, watch: watchClient(c)}
	if cc, ok := c.(*redis.ClusterClient); ok {
		conn.Master = func(ctx context.Context, key string) (string, error) {
			node, err := cc.MasterForKey(ctx, key)
			if err != nil {
				return "", err
			}
			return node.Options().Addr, nil
		}
		conn.Reload = cc.ReloadState
		conn.Node = cc.MasterForKey
	}
	return conn
}

// AutoPipelined is Conn(c) with lone script calls batched (Lanes): the
// store's lanes (lanes.go) send the calls of concurrent Takes waiting for
// the same master as one call of the batch script, and a behaviour rider
// travels with the next command of its own master's lane. Several calls of
// one Take keep one round trip per node. A batched call still runs once
// its caller's deadline has passed (the deadline ends only the wait), as a
// call already written to a plain connection does.
//
// The lanes live in the store and need no stopping: the func returned does
// nothing and the error is always nil (both kept for existing callers).
func AutoPipelined(c redis.UniversalClient) (RedisConn, func() error, error) {
	conn := Conn(c)
	conn.Lanes = true
	return conn, func() error { return nil }, nil
}

func urlErr(raw string, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("empty URL %q", raw)
}
