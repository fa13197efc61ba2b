package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/pkg/region"
)

func originProc(s Spec, dir string) proc.Daemon {
	o := s.Origin
	return proc.Daemon{Name: "origin", Dir: dir, Bin: filepath.Join(s.Bin, "stackorigin"), Args: []string{
		"--listen", addr(o.Port),
		"--workers", strconv.Itoa(o.Workers),
		"--service-time", o.ServiceTime,
		"--queue", strconv.Itoa(o.Queue),
	}}
}

func ensureOrigin(ctx context.Context, s Spec, dir string) error {
	p := originProc(s, dir)
	if _, err := p.Ensure(); err != nil {
		return err
	}
	return p.WaitAlive(ctx, "origin of "+s.Origin.Region, func(ctx context.Context) error {
		return httpOK(ctx, "http://"+addr(s.Origin.Port)+"/healthz")
	})
}

// URL is the edge's public base URL.
func (e EdgeSpec) URL() string {
	return "http://" + net.JoinHostPort(e.Addr, strconv.Itoa(e.Port))
}

// AdminURL is the edge's admin base URL.
func (e EdgeSpec) AdminURL() string {
	return "http://" + net.JoinHostPort(e.Addr, strconv.Itoa(e.AdminPort))
}

func edgeProc(s Spec, dir string) proc.Daemon {
	e := s.Edge
	listen := net.JoinHostPort(e.Addr, strconv.Itoa(e.Port))
	args := []string{
		"--region", e.Region, "--pop", e.PoP,
		"--listen", listen,
		"--admin", net.JoinHostPort(e.Addr, strconv.Itoa(e.AdminPort)),
		"--advertise", listen,
		"--consul", e.Consul,
		"--rules-cache", filepath.Join(dir, "rules-cache.yaml"),
		"--origin", e.Origin,
		"--trusted-proxies", "127.0.0.1/32",
		"--nodes-in-region", strconv.Itoa(max(e.NodesInRegion, 1)),
		"--nodes-in-pop", strconv.Itoa(max(e.NodesInPoP, 1)),
		// A drained edge leaves DNS within the check interval; 5 s of 503
		// on /readyz covers it before the listener closes.
		"--drain-delay", "5s",
		"--shutdown-timeout", "5s",
	}
	if e.Redis != "" {
		args = append(args, "--redis", e.Redis, "--redis-mode", e.RedisMode)
		if e.RedisTimeout != "" {
			args = append(args, "--redis-timeout", e.RedisTimeout)
		}
	}
	if e.Workers > 0 {
		args = append(args, "--workers", strconv.Itoa(e.Workers))
	}
	if e.TLSPort > 0 {
		// Certificates from the region's Consul KV (reconcile puts the
		// stack's there before the edges start).
		args = append(args, "--listen-tls", net.JoinHostPort(e.Addr, strconv.Itoa(e.TLSPort)))
	}
	if e.RLSPort > 0 {
		// Its documents are the region's rls/ keys in Consul (regionctl
		// rls push); the edge registers it as a service of its own.
		args = append(args, "--rls-listen", net.JoinHostPort(e.Addr, strconv.Itoa(e.RLSPort)))
	}
	args = append(args, e.ExtraArgs...)
	// The salt is a secret: the edge takes it from its environment only.
	return proc.Daemon{Name: "edge", Dir: dir, Bin: filepath.Join(s.Bin, "edge"), Args: args, Env: []string{"EDGEGUARD_KEY_SALT=" + e.KeySalt}}
}

// ensureEdge starts the edge unless it runs and waits until it is alive;
// reconcile waits for it to be ready (rules loaded, registered).
func ensureEdge(ctx context.Context, s Spec, dir string) error {
	p := edgeProc(s, dir)
	if _, err := p.Ensure(); err != nil {
		return err
	}
	return p.WaitAlive(ctx, "edge "+s.Edge.Name, func(ctx context.Context) error {
		return httpOK(ctx, s.Edge.AdminURL()+"/healthz")
	})
}

func prometheusProc(dir, bin string, s Spec) proc.Daemon {
	return proc.Daemon{Name: "prometheus", Dir: dir, Bin: bin, Args: []string{
		"--config.file=" + filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=1d",
		"--web.listen-address=" + addr(s.Prometheus.Port),
		"--web.enable-remote-write-receiver",
		"--web.enable-lifecycle",
	}}
}

// prometheusConfig scrapes every edge's admin /metrics, found through each
// region's Consul (consul_sd_configs), every redis exporter and itself.
// The edges' rate limit services are a job of their own, found as their
// own Consul service: the same /metrics (the service's metrics_port meta),
// keeping only the service's series, which the edge job leaves out — so
// each series is stored once and `up` tells of each service. Its instance
// is its edge's (meta edge), so the boards' edge selector covers both.
func prometheusConfig(p PrometheusSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n  scrape_timeout: %s\nscrape_configs:\n", p.ScrapeInterval, p.ScrapeInterval, p.ScrapeInterval)
	sd := func(service string) {
		fmt.Fprintf(&b, "    consul_sd_configs:\n")
		for _, dc := range sortedKeys(p.Consuls) {
			fmt.Fprintf(&b, "      - server: %q\n        datacenter: %q\n        services: [%q]\n        refresh_interval: 5s\n", p.Consuls[dc], dc, service)
		}
	}
	const rlsSeries = "edgeguard_rls_.+"
	fmt.Fprintf(&b, "  - job_name: %s\n", region.RLSService)
	sd(region.RLSService)
	fmt.Fprintf(&b, `    relabel_configs:
      - source_labels: [__meta_consul_service_address, __meta_consul_service_metadata_metrics_port]
        separator: ":"
        target_label: __address__
      - source_labels: [__meta_consul_service_metadata_region]
        target_label: region
      - source_labels: [__meta_consul_service_metadata_pop]
        target_label: pop
      - source_labels: [__meta_consul_service_metadata_edge]
        target_label: instance
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: %q
        action: keep
`, rlsSeries)
	fmt.Fprintf(&b, "  - job_name: edgeguard-edge\n")
	sd(p.Service)
	fmt.Fprintf(&b, `    metric_relabel_configs:
      - source_labels: [__name__]
        regex: %q
        action: drop
`, rlsSeries)
	fmt.Fprintf(&b, `    relabel_configs:
      - source_labels: [__meta_consul_service_address]
        target_label: __address__
        replacement: "${1}:%d"
      - source_labels: [__meta_consul_service_metadata_region]
        target_label: region
      - source_labels: [__meta_consul_service_metadata_pop]
        target_label: pop
      - source_labels: [__meta_consul_service_id]
        target_label: instance
`, p.AdminPort)
	fmt.Fprintf(&b, "  - job_name: redis\n    static_configs:\n")
	for _, region := range sortedKeys(p.Exporters) {
		q := make([]string, len(p.Exporters[region]))
		for i, a := range p.Exporters[region] {
			q[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&b, "      - targets: [%s]\n        labels: {region: %q}\n", strings.Join(q, ", "), region)
	}
	fmt.Fprintf(&b, "  - job_name: prometheus\n    static_configs:\n      - targets: [%q]\n", addr(p.Port))
	return b.String()
}

func ensurePrometheus(ctx context.Context, s Spec, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(prometheusConfig(*s.Prometheus)), 0o644); err != nil {
		return err
	}
	// scripts/install-prometheus.sh names one with Consul discovery.
	// A reconcile without it keeps the binary the stack was started with.
	bin := os.Getenv("EDGEGUARD_PROMETHEUS")
	if data, err := os.ReadFile(filepath.Join(dir, "prometheus.pid")); bin == "" && err == nil {
		_, bin = proc.ParsePidFile(data)
	}
	if bin == "" {
		bin = "prometheus"
	}
	bin, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("prometheus not found (run \"make tools\"; scripts/install-prometheus.sh names one): %w", err)
	}
	p := prometheusProc(dir, bin, s)
	if _, err := p.Ensure(); err != nil {
		return err
	}
	return p.WaitAlive(ctx, "prometheus", func(ctx context.Context) error {
		return httpOK(ctx, "http://"+addr(s.Prometheus.Port)+"/-/ready")
	})
}
