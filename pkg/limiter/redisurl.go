package limiter

import (
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

func urlErr(raw string, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("empty URL %q", raw)
}
