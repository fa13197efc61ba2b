package edge

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// globalRegions is the edge's side of global rules (scope: global): the
// region catalog from its own region's Consul (regions/catalog), one Redis
// client per other region named there, and the limiter's Global, which
// leases from those regions in the background. Without a catalog every key
// is homed in this region: a global rule is then counted like a leased one.
type globalRegions struct {
	e  *Edge
	g  *limiter.Global
	mu sync.Mutex
	// clients by region, with the URL and mode they were built for.
	clients map[string]homeClient
	// fromConsul: the regions in force came from a catalog document, so
	// the document going absent is a missing document, not "this region
	// alone" (missing.go).
	fromConsul bool
}

type homeClient struct {
	url, mode string
	dial      map[string]string
	client    redis.UniversalClient
	store     *limiter.RedisStore
}

// buildGlobal gives the limiter its Global (with Redis only: the
// embedded memory store is one region by definition).
func (e *Edge) buildGlobal(reg prometheus.Registerer) error {
	if e.cfg.Redis == "" {
		return nil
	}
	gr := &globalRegions{e: e, clients: map[string]homeClient{}}
	g, err := limiter.NewGlobal(limiter.GlobalConfig{OnChange: gr.reachabilityChanged}, reg, e.log)
	if err != nil {
		return err
	}
	gr.g = g
	if err := g.Update(limiter.Regions{Local: e.cfg.Region, Names: []string{e.cfg.Region}}); err != nil {
		return err
	}
	e.limiter.SetGlobal(g)
	e.global = gr
	e.closers = append(e.closers, gr.close) // before the limiter closes
	return nil
}

// apply takes a catalog document (nil: none stored).
func (gr *globalRegions) apply(data []byte) error {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	local := gr.e.cfg.Region
	if data == nil && gr.fromConsul {
		if gr.e.consul.SetMissing(consullink.DocCatalog, true) {
			gr.e.log.Warn("region catalog missing in consul; keeping the regions in force", "key", region.NewLayout(gr.e.cfg.ConsulPrefix).Catalog())
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
	gr.e.consul.SetMissing(consullink.DocCatalog, false)
	gr.e.log.Info("region catalog loaded", "regions", cat.Names())
	return nil
}

// watch follows the catalog in the edge's own region's Consul.
func (gr *globalRegions) watch(ctx context.Context, client *region.Client, onErr func(error)) {
	client.WatchCatalog(ctx, func(data []byte) {
		if err := gr.apply(data); err != nil {
			gr.e.metrics.rulesErrors.Inc()
			gr.e.log.Error("region catalog from consul refused; keeping the regions in force", "err", err)
		}
	}, onErr)
}

// reachabilityChanged re-registers the edge so that the catalog (and
// regionctl regions status) says which homes it decides from the share.
func (gr *globalRegions) reachabilityChanged() {
	if gr.e.consul != nil {
		gr.e.consul.RulesChanged()
	}
}

// unreachable lists the home regions the edge cannot reach (nil-safe).
func (gr *globalRegions) unreachable() []string {
	if gr == nil {
		return nil
	}
	return gr.g.Unreachable()
}

func (gr *globalRegions) close() {
	gr.g.Close()
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for _, rc := range gr.clients {
		_ = rc.client.Close()
	}
	gr.clients = nil
}
