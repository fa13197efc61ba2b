package limiter

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// masterForKey is a Cluster client: it knows which master serves a key.
type masterForKey interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

var _ Sharder = (*RedisStore)(nil)

// Shard names the Cluster master that owns a limit's keys ("" outside a
// Cluster, or while the slot map is unknown): the Limiter keeps a breaker per
// master, so one dead master sends only its own keys to the fallback. After
// a failover the slot maps to the promoted replica, a new shard with a
// closed breaker.
func (s *RedisStore) Shard(l Limit) string {
	c, ok := s.client.(masterForKey)
	if !ok {
		return ""
	}
	node, err := c.MasterForKey(context.Background(), s.Keys(l)[0])
	if err != nil {
		return ""
	}
	return node.Options().Addr
}
