package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// OpenOptions are a limiter over Redis, as a process builds it from its
// settings.
type OpenOptions struct {
	// URL and Mode are NewRedisClient's.
	URL  string
	Mode Mode
	// Autopipeline sends single-limit calls through AutoPipelined.
	Autopipeline bool
	// KeyPrefix is NewRedisStore's ("" the default layout).
	KeyPrefix string
	// Config is the limiter's (StoreName is set to "redis").
	Config Config
	Log    *slog.Logger
}

// Opened is a limiter over Redis and what the process keeps of it.
type Opened struct {
	Limiter *Limiter
	Store   *RedisStore
	Client  redis.UniversalClient
	// LoadErr is why the scripts could not be loaded at start (Redis not
	// reachable: the limiter starts anyway, AP, and they load on first
	// use); nil when they were.
	LoadErr error
	closers []func()
}

// Close closes the limiter, then the pipelining, then the client.
func (o *Opened) Close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		o.closers[i]()
	}
	o.closers = nil
}

// Open connects a limiter to Redis: the client, autopipelining when asked,
// the store with its scripts loaded (within 2 s; a Redis that does not
// answer yet is LoadErr, not an error), and the limiter. A Redis too old
// for the scripts is ErrRedisTooOld. On an error nothing is left open.
func Open(o OpenOptions, reg prometheus.Registerer) (*Opened, error) {
	op := &Opened{}
	ok := false
	defer func() {
		if !ok {
			op.Close()
		}
	}()
	client, err := NewRedisClient(o.URL, o.Mode)
	if err != nil {
		return nil, err
	}
	op.Client = client
	op.closers = append(op.closers, func() { _ = client.Close() })
	conn := Conn(client)
	if o.Autopipeline {
		ap, stop, err := AutoPipelined(client)
		if err != nil {
			return nil, err
		}
		op.closers = append(op.closers, func() { _ = stop() }) // before the client closes
		conn = ap
	}
	rs, err := NewRedisStore(conn, o.KeyPrefix)
	if err != nil {
		return nil, err
	}
	op.closers = append(op.closers, rs.workers.stop) // after the limiter's last call
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	op.LoadErr = rs.Load(ctx)
	cancel()
	if errors.Is(op.LoadErr, ErrRedisTooOld) {
		return nil, op.LoadErr
	}
	cfg := o.Config
	cfg.StoreName = "redis"
	l, err := New(rs, cfg, reg, o.Log)
	if err != nil {
		return nil, err
	}
	l.StoreFailed(op.LoadErr) // readiness knows before the first request
	op.Limiter, op.Store = l, rs
	op.closers = append(op.closers, l.Close) // before the pipelining and the client
	ok = true
	return op, nil
}

// LogRedisTo routes go-redis's own messages (failed dials while Redis is
// down) to log at debug: the limiter's metrics and breaker logs say it
// once. go-redis has one logger per process.
func LogRedisTo(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, "redis client", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
