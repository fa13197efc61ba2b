package hostroute

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Origins are where requests go: the default pool (--origin), the host
// table's router over it, and the tunnels (WebSocket).
type Origins struct {
	Router  *Router
	Tunnels *origin.Tunnels
	closers []func()
}

// OpenOrigins builds the proxy to the origins in cfg (or to the built-in
// demo origin, only when asked for), the tunnels and the host table.
// What it built is closed again when it fails.
func OpenOrigins(cfg config.Config, reg prometheus.Registerer, log *slog.Logger) (_ *Origins, err error) {
	o := &Origins{}
	defer func() {
		if err != nil {
			o.Close()
		}
	}()
	origins := cfg.Origins
	if cfg.DemoOrigin {
		addr, stop, err := origin.StartDemo()
		if err != nil {
			return nil, fmt.Errorf("starting demo origin: %w", err)
		}
		o.closers = append(o.closers, stop)
		origins = []string{"http://" + addr}
		log.Warn("--demo-origin: proxying to the built-in demo origin", "addr", addr)
	}
	ocfg, err := originConfig(cfg, origins)
	if err != nil {
		return nil, err
	}
	om, err := origin.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("configuring origins: %w", err)
	}
	proxy, err := origin.NewPool(ocfg, om, log)
	if err != nil {
		return nil, fmt.Errorf("configuring origins: %w", err)
	}
	o.closers = append(o.closers, proxy.Close)
	if o.Tunnels, err = origin.NewTunnels(origin.TunnelConfig{MaxOpen: cfg.MaxTunnels, IdleTimeout: cfg.TunnelIdleTimeout}, reg); err != nil {
		return nil, fmt.Errorf("configuring tunnels: %w", err)
	}
	if o.Router, err = openRouter(Settings{
		PathSemantics: cfg.PathSemantics, RefuseAmbiguousPaths: cfg.RefuseAmbiguousPaths, File: cfg.Hosts,
	}, proxy, ocfg, om, reg, log); err != nil {
		return nil, err
	}
	o.closers = append(o.closers, o.Router.Close)
	return o, nil
}

// originConfig is the default pool's settings, which the table's pools
// start from.
func originConfig(cfg config.Config, origins []string) (origin.Config, error) {
	ocfg := origin.DefaultConfig()
	ocfg.URLs, ocfg.DialTimeout = origins, cfg.OriginDialTimeout
	ocfg.HeaderTimeout, ocfg.ReadIdleTimeout, ocfg.Timeout = cfg.OriginHeaderTimeout, cfg.OriginReadIdleTimeout, cfg.OriginTimeout
	// Every worker can hold one origin connection (a retry on another
	// origin comes after the first attempt's connection is back), and the
	// active health check one more: a pool smaller than that would fail
	// requests the edge admitted.
	ocfg.MaxConnsPerHost = cfg.Workers + 1
	if cfg.OriginMaxConns > 0 {
		ocfg.MaxConnsPerHost = cfg.OriginMaxConns
	}
	ocfg.MaxRequestBodySize = cfg.MaxBodyBytes
	ocfg.Concurrency = shedder.PoolLimitConfig{Limit: cfg.OriginConcurrencyLimit,
		Queue: cfg.OriginConcurrencyQueue, QueueTimeout: cfg.OriginConcurrencyQueueTimeout}
	ocfg.TLS.ServerName, ocfg.TLS.InsecureSkipVerify = cfg.OriginTLSServerName, cfg.OriginTLSInsecureSkipVerify
	if f := cfg.OriginCAFile; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return ocfg, fmt.Errorf("origin-ca-file: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return ocfg, fmt.Errorf("origin-ca-file: no PEM certificate in %s", f)
		}
		ocfg.TLS.CAPEM = pem
	}
	return ocfg, nil
}

// End ends the response bodies still streaming from an origin and the
// tunnels (shortly before the shutdown timeout).
func (o *Origins) End() {
	o.Router.EndStreams()
	o.Tunnels.End()
}

// Close closes what OpenOrigins built, the router first.
func (o *Origins) Close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		o.closers[i]()
	}
	o.closers = nil
}
