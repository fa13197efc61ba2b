// Package globalhome is the edge's side of global rules (scope: global):
// the region catalog from its own region's Consul (regions/catalog), one
// Redis client per other region named there, and the limiter's Global,
// which leases from those regions in the background. Without a catalog
// every key is homed in this region: a global rule is then counted like a
// leased one.
package globalhome

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Regions is the catalog's regions in force and their clients.
type Regions struct {
	o  Options
	g  *limiter.Global
	mu sync.Mutex
	// clients by region, with the URL and mode they were built for.
	clients map[string]homeClient
	// fromConsul: the regions in force came from a catalog document, so
	// the document going absent is a missing document, not "this region
	// alone" (missing.go).
	fromConsul bool
}

// Options is what Regions takes from the rest of the edge.
type Options struct {
	Region, ConsulPrefix string
	Log                  *slog.Logger
	// SetMissing marks the catalog document missing in Consul (or found
	// again); it reports whether that is news.
	SetMissing func(missing bool) bool
	// Refused counts a catalog refused; ReachabilityChanged re-registers
	// the edge so that the catalog (and regionctl regions status) says
	// which homes it decides from the share.
	Refused, ReachabilityChanged func()
}

type homeClient struct {
	url, mode string
	dial      map[string]string
	client    redis.UniversalClient
	store     *limiter.RedisStore
}

// Open is New for the edge's settings: none without --redis (the
// embedded memory store is one region by definition).
func Open(cfg config.Config, lim *limiter.Limiter, o Options, reg prometheus.Registerer) (*Regions, error) {
	if cfg.Redis == "" {
		return nil, nil
	}
	o.Region, o.ConsulPrefix = cfg.Region, cfg.ConsulPrefix
	return New(lim, o, reg)
}

// New gives the limiter its Global, this region alone until a catalog
// arrives (Apply, Watch). The caller closes it before the limiter.
func New(lim *limiter.Limiter, o Options, reg prometheus.Registerer) (*Regions, error) {
	gr := &Regions{o: o, clients: map[string]homeClient{}}
	g, err := limiter.NewGlobal(limiter.GlobalConfig{OnChange: o.ReachabilityChanged}, reg, o.Log)
	if err != nil {
		return nil, err
	}
	gr.g = g
	if err := g.Update(limiter.Regions{Local: o.Region, Names: []string{o.Region}}); err != nil {
		return nil, err
	}
	lim.SetGlobal(g)
	return gr, nil
}

// Apply takes a catalog document (nil: none stored).
func (gr *Regions) Apply(data []byte) error {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	local := gr.o.Region
	if data == nil && gr.fromConsul {
		if gr.o.SetMissing(true) {
			gr.o.Log.Warn("region catalog missing in consul; keeping the regions in force", "key", region.NewLayout(gr.o.ConsulPrefix).Catalog())
		}
		return nil
	}
	cat := region.Catalog{Regions: []region.CatalogRegion{{Name: local}}}
	if data != nil {
		var err error
		if cat, err = region.ParseCatalog(data); err != nil {
			return err
		}
		if !slices.Contains(cat.Names(), local) {
			return fmt.Errorf("region catalog: this edge's region %q is not listed", local)
		}
	}
	next := map[string]homeClient{}
	stores := map[string]limiter.Store{}
	for _, r := range cat.Regions {
		if r.Name == local {
			continue
		}
		rc, ok := gr.clients[r.Name]
		if !ok || rc.url != r.Redis || rc.mode != r.RedisMode || !maps.Equal(rc.dial, r.Dial) {
			mode, err := limiter.ParseMode(r.RedisMode)
			if err != nil {
				return err
			}
			c, err := limiter.NewRedisClient(r.Redis, mode, r.Dial)
			if err != nil {
				return fmt.Errorf("region catalog: redis of %s: %w", r.Name, err)
			}
			st, err := limiter.NewRedisStore(limiter.Conn(c), "")
			if err != nil {
				_ = c.Close()
				return err
			}
			rc = homeClient{url: r.Redis, mode: r.RedisMode, dial: r.Dial, client: c, store: st}
		}
		next[r.Name], stores[r.Name] = rc, rc.store
	}
	err := gr.g.Update(limiter.Regions{Local: local, Names: cat.Names(), Stores: stores})
	if err != nil {
		next = gr.clients // keep what was in force
	}
	for name, rc := range gr.clients {
		if n, ok := next[name]; !ok || n.client != rc.client {
			_ = rc.client.Close()
		}
	}
	if err != nil {
		for name, rc := range next {
			if gr.clients[name].client != rc.client {
				_ = rc.client.Close()
			}
		}
		return err
	}
	gr.clients = next
	gr.fromConsul = data != nil
	gr.o.SetMissing(false)
	gr.o.Log.Info("region catalog loaded", "regions", cat.Names())
	return nil
}

// Watch follows the catalog in the edge's own region's Consul.
func (gr *Regions) Watch(ctx context.Context, client *region.Client, onErr func(error)) {
	client.WatchCatalog(ctx, func(data []byte) {
		if err := gr.Apply(data); err != nil {
			gr.o.Refused()
			gr.o.Log.Error("region catalog from consul refused; keeping the regions in force", "err", err)
		}
	}, onErr)
}

// Unreachable lists the home regions the edge cannot reach (nil-safe).
func (gr *Regions) Unreachable() []string {
	if gr == nil {
		return nil
	}
	return gr.g.Unreachable()
}

// Close stops the Global and closes the other regions' clients.
func (gr *Regions) Close() {
	if gr == nil {
		return
	}
	gr.g.Close()
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for _, rc := range gr.clients {
		_ = rc.client.Close()
	}
	gr.clients = nil
}
