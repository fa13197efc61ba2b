package limiter

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Shard names the Cluster master that owns a limit's keys ("" outside a
// Cluster, or while the slot map is unknown): the Limiter keeps a breaker per
// master, so one dead master sends only its own keys to the fallback. After
// a failover the slot maps to the promoted replica, a new shard with a
// closed breaker.
func (s *RedisStore) Shard(l Limit) string {
	if s.conn.Master == nil {
		return ""
	}
	// The slot map loads on first use: bounded, or a Cluster out of reach
	// (another region's, behind a black-holed link) holds the call, and
	// the lease waiting on it, forever instead of failing it.
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	addr, err := s.conn.Master(ctx, s.Keys(l)[0])
	if err != nil {
		return ""
	}
	return addr
}

// Refresh implements Store: a Cluster reloads its slot map in the background.
func (s *RedisStore) Refresh() {
	if s.conn.Reload != nil {
		s.conn.Reload(context.Background())
	}
}

// Probe implements Store: a read-only EXISTS on a key in the limit's hash
// slot, so it reaches the master that serves the limit's keys.
func (s *RedisStore) Probe(ctx context.Context, l Limit) error {
	pipe := s.client.Pipeline()
	pipe.Exists(ctx, s.prefix+"{"+l.Key+"}:probe")
	_, err := pipe.Exec(ctx)
	var rerr redis.Error
	if err != nil && s.conn.Reload != nil && !errors.As(err, &rerr) {
		s.conn.Reload(context.Background())
	}
	return err
}

// Probe implements Store: memory always answers.
func (s *MemoryStore) Probe(context.Context, Limit) error { return nil }

// Refresh implements Store: one process holds every key.
func (s *MemoryStore) Refresh() {}

// Remote implements Store: every call crosses the network.
func (s *RedisStore) Remote() bool { return true }

// Shard implements Store: one process holds every key.
func (s *MemoryStore) Shard(Limit) string { return "" }

// Remote implements Store: calls never wait on I/O.
func (s *MemoryStore) Remote() bool { return false }
