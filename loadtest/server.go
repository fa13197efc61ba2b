package edgeguard

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/grafana/sobek"

	"github.com/edgeguard/edgeguard/loadtest/internal/serverstats"
)

var scrapeClient = &http.Client{Timeout: 5 * time.Second}

// Scrape is scrape(name, urls): fetch every edge's admin /metrics now and
// keep the snapshot under name (e.g. "start" in setup, "end" in teardown).
// It fails if any target fails, naming each.
func (mi *ModuleInstance) Scrape(name string, urls []string) error {
	if name == "" || len(urls) == 0 {
		return fmt.Errorf("scrape: want a name and at least one URL")
	}
	s, err := serverstats.Scrape(mi.vu.Context(), scrapeClient, urls)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", name, err)
	}
	mi.root.mu.Lock()
	mi.root.snapshots[name] = s
	mi.root.mu.Unlock()
	return nil
}

// ServerDelta is serverDelta(from, to): the server-side figures between two
// snapshots. It also emits them as the edgeguard_server gauge (tag figure,
// group) so they sit in k6's summary and outputs, and keeps the report for
// serverReport().
func (mi *ModuleInstance) ServerDelta(from, to string) (sobek.Value, error) {
	mi.root.mu.Lock()
	a, b := mi.root.snapshots[from], mi.root.snapshots[to]
	mi.root.mu.Unlock()
	if a == nil || b == nil {
		return nil, fmt.Errorf("serverDelta: no snapshot %q or %q (call scrape first)", from, to)
	}
	r := serverstats.Delta(a, b, serverstats.DefaultFigures())
	mi.root.mu.Lock()
	mi.root.report = &r
	mi.root.mu.Unlock()
	if mi.vu.State() != nil {
		for fig, groups := range r.Deltas {
			for g, v := range groups {
				_ = mi.push(mi.metrics.server, v, map[string]string{"figure": fig, "group": g})
			}
		}
		_ = mi.push(mi.metrics.server, r.ScriptCallsPerRequest, map[string]string{"figure": "script_calls_per_request"})
	}
	return toJS(mi.vu.Runtime(), r)
}

// ServerReport is serverReport(): the last serverDelta result, or null.
func (mi *ModuleInstance) ServerReport() (sobek.Value, error) {
	mi.root.mu.Lock()
	r := mi.root.report
	mi.root.mu.Unlock()
	if r == nil {
		return sobek.Null(), nil
	}
	return toJS(mi.vu.Runtime(), r)
}

// ScrapeValues is scrapeValues(urls, metric): the current value of a gauge
// or counter family on each target, summed over its series ({url: value}).
func (mi *ModuleInstance) ScrapeValues(urls []string, metric string) (map[string]float64, error) {
	s, err := serverstats.Scrape(mi.vu.Context(), scrapeClient, urls)
	if err != nil {
		return nil, fmt.Errorf("scrapeValues: %w", err)
	}
	out := map[string]float64{}
	for _, u := range urls {
		out[u] = s.TargetSum(u, metric)
	}
	return out, nil
}

// Resolve is resolve(dns, name): the A/AAAA records of name asked of the
// DNS server at dns (host:port, e.g. a region's Consul DNS and
// "edge.query.consul"), cached for a second so a VU can ask per request.
func (mi *ModuleInstance) Resolve(server, name string) ([]string, error) {
	key := server + "|" + name
	now := time.Now()
	mi.root.mu.Lock()
	if e, ok := mi.root.dns[key]; ok && now.Before(e.expires) {
		mi.root.mu.Unlock()
		return e.addrs, nil
	}
	mi.root.mu.Unlock()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", server)
	}}
	ctx, cancel := context.WithTimeout(mi.vu.Context(), 2*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("resolving %s at %s: %w", name, server, err)
	}
	sort.Strings(addrs)
	mi.root.mu.Lock()
	mi.root.dns[key] = dnsEntry{addrs: addrs, expires: now.Add(time.Second)}
	mi.root.mu.Unlock()
	return addrs, nil
}

// Observe is observe(name, value): append a timestamped value to a series
// shared by every VU.
func (mi *ModuleInstance) Observe(name string, value float64) error {
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return fmt.Errorf("observe %s: value %v is not a number", name, value)
	}
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	mi.root.series[name] = append(mi.root.series[name], point{t: time.Now(), v: value})
	return nil
}

func (mi *ModuleInstance) values(name string, fromMs, toMs float64) []point {
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	var out []point
	for _, p := range mi.root.series[name] {
		ms := float64(p.t.UnixMicro()) / 1000
		if (fromMs == 0 || ms >= fromMs) && (toMs == 0 || ms <= toMs) {
			out = append(out, p)
		}
	}
	return out
}

// Quantile is quantile(name, q, fromMs, toMs): the q-quantile (nearest
// rank) of a series' values observed between two now() readings (0 = open);
// null when there are none.
func (mi *ModuleInstance) Quantile(name string, q, fromMs, toMs float64) (sobek.Value, error) {
	if q < 0 || q > 1 {
		return nil, fmt.Errorf("quantile %s: q %v: want 0..1", name, q)
	}
	pts := mi.values(name, fromMs, toMs)
	if len(pts) == 0 {
		return sobek.Null(), nil
	}
	vs := make([]float64, len(pts))
	for i, p := range pts {
		vs[i] = p.v
	}
	slices.Sort(vs)
	i := int(math.Ceil(q*float64(len(vs)))) - 1
	return mi.vu.Runtime().ToValue(vs[max(i, 0)]), nil
}

// Slope is slope(name, fromMs, toMs): the least-squares growth of a series
// per minute between two now() readings; null with fewer than two points.
func (mi *ModuleInstance) Slope(name string, fromMs, toMs float64) (sobek.Value, error) {
	pts := mi.values(name, fromMs, toMs)
	if len(pts) < 2 {
		return sobek.Null(), nil
	}
	var sx, sy, sxx, sxy float64
	t0 := pts[0].t
	for _, p := range pts {
		x := p.t.Sub(t0).Minutes()
		sx, sy, sxx, sxy = sx+x, sy+p.v, sxx+x*x, sxy+x*p.v
	}
	n := float64(len(pts))
	den := n*sxx - sx*sx
	if den == 0 {
		return sobek.Null(), nil
	}
	return mi.vu.Runtime().ToValue((n*sxy - sx*sy) / den), nil
}

// Gauge is gauge(figure, value): emit one edgeguard_server sample (tag
// figure), e.g. a soak's computed growth, so a threshold can judge it.
func (mi *ModuleInstance) Gauge(figure string, value float64) error {
	return mi.push(mi.metrics.server, value, map[string]string{"figure": figure})
}
