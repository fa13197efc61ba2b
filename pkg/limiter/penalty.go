package limiter

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// PenaltyBox keeps keys denied for a while after a rule denied them (a
// mitigation timeout): whatever the key then sends, and however slowly, it
// is denied until the penalty ends. Penalties live in the region's Redis,
// one key each ("{<key>}:penalty" with a millisecond TTL), so every edge of
// the region enforces a penalty any of them imposed; each edge also
// remembers the penalties it has seen until they end, so a penalised flood
// costs Redis nothing more. Without Redis (the memory store) penalties are
// this process's only.
//
// The cost: a request matching a rule with a penalty asks Redis once more
// (one pipelined PTTL for all its penalty keys) unless this edge already
// knows the key is penalised; a denial that trips a penalty sends one SET.
type PenaltyBox struct {
	client  RedisClient // nil: this process only
	prefix  string
	timeout time.Duration
	now     func() time.Time

	mu    sync.Mutex
	until map[string]time.Time // key -> end of its penalty, as known here
	max   int
}

// ErrPenaltyStore wraps a failed penalty call: the request goes on as
// though the key were not penalised (availability first).
var ErrPenaltyStore = errors.New("penalty store failed")

// NewPenaltyBox returns a box over client (nil: local only), with the
// store deadline timeout, remembering at most maxKeys penalties locally.
func NewPenaltyBox(client RedisClient, prefix string, timeout time.Duration, maxKeys int) *PenaltyBox {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if maxKeys <= 0 {
		maxKeys = 100_000
	}
	return &PenaltyBox{client: client, prefix: prefix, timeout: timeout, now: time.Now, until: map[string]time.Time{}, max: maxKeys}
}

// RedisKey is the Redis key holding key's penalty.
func (p *PenaltyBox) RedisKey(key string) string { return p.prefix + "{" + key + "}:penalty" }

// Check sets left[i] to how long keys[i] stays penalised (0: it is not).
// Keys known here to be penalised are answered without Redis; the others
// take one pipelined round trip together. On a Redis error the unknown keys
// read as not penalised and the error (ErrPenaltyStore) is returned.
func (p *PenaltyBox) Check(ctx context.Context, keys []string, left []time.Duration) error {
	now := p.now()
	var ask []int
	p.mu.Lock()
	for i, k := range keys {
		left[i] = 0
		if t, ok := p.until[k]; ok {
			if d := t.Sub(now); d > 0 {
				left[i] = d
				continue
			}
			delete(p.until, k)
		}
		ask = append(ask, i)
	}
	p.mu.Unlock()
	if len(ask) == 0 || p.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pipe := p.client.Pipeline()
	cmds := make([]*redis.DurationCmd, len(ask))
	for j, i := range ask {
		cmds[j] = pipe.PTTL(ctx, p.RedisKey(keys[i]))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return errors.Join(ErrPenaltyStore, err)
	}
	for j, i := range ask {
		// PTTL: -2 no key, -1 no TTL (never written so), else the time left.
		// Anchored at the time the call was sent: never later than Redis.
		if d := cmds[j].Val(); d > 0 {
			left[i] = d
			p.remember(keys[i], now.Add(d), now)
		}
	}
	return nil
}

// Trip penalises key for d, in Redis (region-wide) and here.
func (p *PenaltyBox) Trip(ctx context.Context, key string, d time.Duration) error {
	now := p.now()
	p.remember(key, now.Add(d), now)
	if p.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	cmd := redis.NewStatusCmd(ctx, "set", p.RedisKey(key), 1, "px", d.Milliseconds())
	if err := p.client.Process(ctx, cmd); err != nil {
		return errors.Join(ErrPenaltyStore, err)
	}
	return nil
}

// remember keeps key's penalty end locally. The map is bounded: when it is
// full, ended penalties are dropped, and if none had ended the new one is
// not remembered (Redis still holds it).
func (p *PenaltyBox) remember(key string, until, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.until[key]; !ok && len(p.until) >= p.max {
		for k, t := range p.until {
			if !t.After(now) {
				delete(p.until, k)
			}
		}
		if len(p.until) >= p.max {
			return
		}
	}
	p.until[key] = until
}
