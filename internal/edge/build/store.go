package build

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Store is the rate limit store and what decides on it.
type Store struct {
	Limiter   *limiter.Limiter
	Redis     *limiter.RedisStore // nil with the memory store
	Penalties *limiter.PenaltyBox // the rules' penalties (pipeline/escapes.go)
	Name      string              // "redis" or "memory"
	// Close closes the limiter, then the Redis client.
	Close func()
}

// OpenStore is the limiter on cfg's Redis, or on a store in this process
// without one. Redis may be down: the limiter then decides by its fail
// mode until Redis answers.
func OpenStore(cfg config.Config, reg prometheus.Registerer, log *slog.Logger) (*Store, error) {
	lcfg := limiter.Config{Timeout: cfg.RedisTimeout, FailMode: cfg.FailMode, CacheSize: cfg.PrefilterSize}
	if cfg.Redis == "" {
		penalties := limiter.NewPenaltyBox(nil, "", cfg.RedisTimeout, cfg.PrefilterSize)
		lcfg.StoreName = "memory"
		log.Info("no --redis given: counting in this process only (embedded memory store)")
		l, err := limiter.New(limiter.NewMemoryStore(), lcfg, reg, log)
		if err != nil {
			return nil, err
		}
		return &Store{Limiter: l, Penalties: penalties, Name: lcfg.StoreName, Close: l.Close}, nil
	}
	limiter.LogRedisTo(log)
	op, err := limiter.Open(limiter.OpenOptions{URL: cfg.Redis, Mode: cfg.RedisMode, Autopipeline: cfg.RedisAutopipeline, Config: lcfg, Log: log}, reg)
	if errors.Is(err, limiter.ErrRedisTooOld) {
		return nil, fmt.Errorf("redis at %s: %w", redactURL(cfg.Redis), err)
	}
	if err != nil {
		return nil, err
	}
	if op.LoadErr != nil {
		// AP: started anyway; the scripts load on first use once Redis answers.
		log.Warn("redis not reachable at start; deciding locally until it is", "err", op.LoadErr)
	}
	return &Store{
		Limiter:   op.Limiter,
		Redis:     op.Store,
		Penalties: limiter.NewPenaltyBox(op.Client, "", cfg.RedisTimeout, cfg.PrefilterSize),
		Name:      "redis",
		Close:     op.Close,
	}, nil
}

// redactURL drops a URL's password (and query) for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery = ""
	return u.Redacted()
}
