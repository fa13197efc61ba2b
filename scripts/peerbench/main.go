// Command peerbench runs internal/peerbench: the edge's streaming proxy
// beside nginx on loopback (stream), its memory with many slow readers
// (slow), a very large object through it (big), and what a small request
// costs the edge, nginx and HAProxy in each scenario (requests), and one
// tenant's slow origin or flood beside another tenant (tenants).
//
//	peerbench requests -edge bin/edge -nginx /usr/sbin/nginx -haproxy /usr/sbin/haproxy [-sets 3] [-duration 10s] [-scenarios h2,tls] [-h2-clients 16] [-h2-streams 10] [-smoke]
//	peerbench stream -edge bin/edge -nginx /usr/sbin/nginx [-sets 3] [-clients 8] [-requests 200] [-ttfb-only] [-trace 3s]
//	peerbench slow -edge bin/edge [-nginx /usr/sbin/nginx] [-clients 1000] [-hold 60s]
//	peerbench big -edge bin/edge [-size 10737418240]
//	peerbench tenants -edge bin/edge -nginx /usr/sbin/nginx [-sets 2] [-scenarios slow,flood,join] [-phase 20s] [-slow 5s] [-a-clients 1200] [-pin=false] [-deadline 1s] [-smoke]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/edgeguard/edgeguard/internal/peerbench"
)

func main() {
	peerbench.ServeOriginIfAsked()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peerbench stream|slow|big|requests|tenants [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	edge := fs.String("edge", "bin/edge", "edge binary")
	nginx := fs.String("nginx", "/usr/sbin/nginx", "nginx binary (slow: empty = the edge only)")
	var err error
	switch os.Args[1] {
	case "stream":
		cfg := peerbench.DefaultStreamConfig()
		fs.IntVar(&cfg.Sets, "sets", cfg.Sets, "sets (edge and nginx alternate which goes first)")
		fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "keep-alive clients at once")
		fs.IntVar(&cfg.Requests, "requests", cfg.Requests, "time-to-first-byte requests per client")
		scale := fs.Float64("volume-scale", 1, "scales the bytes of each CPU run (64 MiB of 1 KiB objects, 1 GiB of 64 KiB and of 4 MiB)")
		ttfbOnly := fs.Bool("ttfb-only", false, "measure time to first byte only, no CPU runs")
		fs.DurationVar(&cfg.Trace, "trace", 0, "after the sets, trace the edge for this long (whole seconds) under the time-to-first-byte load and print where its requests' time went inside it (0: no trace)")
		_ = fs.Parse(os.Args[2:])
		for i := range cfg.Volumes {
			cfg.Volumes[i] = int64(float64(cfg.Volumes[i]) * *scale)
		}
		if *ttfbOnly {
			cfg.Sizes, cfg.Volumes = nil, nil
		}
		cfg.EdgeBin, cfg.NginxBin = *edge, *nginx
		_, err = peerbench.Stream(ctx, cfg)
	case "slow":
		cfg := peerbench.DefaultSlowConfig()
		fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "slow clients at once")
		fs.DurationVar(&cfg.Hold, "hold", cfg.Hold, "how long the streams run before memory is read")
		fs.Int64Var(&cfg.Rate, "rate", cfg.Rate, "bytes per second each client reads")
		fs.IntVar(&cfg.RcvBuf, "rcvbuf", cfg.RcvBuf, "clients' SO_RCVBUF")
		fs.DurationVar(&cfg.Ramp, "ramp", cfg.Ramp, "the clients start evenly over this")
		edgeArgs := fs.String("edge-args", "", "more flags for the edge, space-separated (--write-timeout 60s)")
		_ = fs.Parse(os.Args[2:])
		cfg.EdgeArgs = strings.Fields(*edgeArgs)
		cfg.EdgeBin, cfg.NginxBin = *edge, *nginx
		_, err = peerbench.SlowReaders(ctx, cfg)
	case "big":
		cfg := peerbench.BigConfig{Size: 10 << 30, Out: os.Stdout}
		fs.Int64Var(&cfg.Size, "size", cfg.Size, "object size in bytes")
		_ = fs.Parse(os.Args[2:])
		cfg.EdgeBin = *edge
		_, err = peerbench.BigObject(ctx, cfg)
	case "requests":
		haproxy := fs.String("haproxy", "/usr/sbin/haproxy", "haproxy binary")
		smoke := fs.Bool("smoke", false, "about a second per target, one set: every scenario and peer started and checked, no figure to keep")
		cfg := peerbench.DefaultRequestsConfig()
		fs.StringVar(&cfg.WrkBin, "wrk", cfg.WrkBin, "wrk binary")
		fs.StringVar(&cfg.H2loadBin, "h2load", cfg.H2loadBin, "h2load binary (nghttp2-client), for the HTTP/2 scenario")
		fs.IntVar(&cfg.H2Clients, "h2-clients", cfg.H2Clients, "h2load connections (-c) in the HTTP/2 scenario")
		fs.IntVar(&cfg.H2Streams, "h2-streams", cfg.H2Streams, "h2load streams at once per connection (-m) in the HTTP/2 scenario")
		picked := fs.String("scenarios", "", "comma-separated scenarios to run (proxied, accesslog, rule, denied, shed, tls, h2); empty = all")
		sets := fs.Int("sets", cfg.Sets, "sets (every target once per set, the proxies' order rotated)")
		fs.IntVar(&cfg.Threads, "threads", cfg.Threads, "wrk threads (-t)")
		fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "wrk connections (-c), and the fixed-rate client's")
		warmup := fs.Duration("warmup", cfg.Warmup, "unmeasured wrk run before each measured one")
		duration := fs.Duration("duration", cfg.Duration, "each measured wrk run (whole seconds)")
		fixed := fs.Duration("fixed", cfg.FixedDuration, "fixed-rate run at half the peak, for the p99 (0 = none)")
		_ = fs.Parse(os.Args[2:])
		if *smoke {
			smokeCfg := peerbench.SmokeRequestsConfig()
			smokeCfg.WrkBin, smokeCfg.Threads, smokeCfg.Conns = cfg.WrkBin, cfg.Threads, cfg.Conns
			smokeCfg.H2loadBin, smokeCfg.H2Clients, smokeCfg.H2Streams = cfg.H2loadBin, cfg.H2Clients, cfg.H2Streams
			cfg = smokeCfg
		} else {
			cfg.Sets, cfg.Warmup, cfg.Duration, cfg.FixedDuration = *sets, *warmup, *duration, *fixed
		}
		cfg.EdgeBin, cfg.NginxBin, cfg.HAProxyBin = *edge, *nginx, *haproxy
		if *picked != "" {
			cfg.Scenarios = strings.Split(*picked, ",")
		}
		_, err = peerbench.Requests(ctx, cfg)
	case "tenants":
		cfg := peerbench.DefaultTenantsConfig()
		smoke := fs.Bool("smoke", false, "the run scaled down to seconds (40 clients, a 1s slowdown, 32 workers): no figure to keep")
		fs.DurationVar(&cfg.Phase, "phase", cfg.Phase, "each phase: b.example alone, then beside a.example")
		fs.DurationVar(&cfg.Slow, "slow", cfg.Slow, "how long the origin takes to answer a.example in the slow-origin scenario")
		fs.IntVar(&cfg.AClients, "a-clients", cfg.AClients, "a.example's clients in the slow-origin scenario, one connection each")
		fs.IntVar(&cfg.FloodFactor, "flood-factor", cfg.FloodFactor, "the flood's connections, in the edge's workers")
		edgeArgs := fs.String("edge-args", "", "more flags for the edge, space-separated (none: the edge at its defaults)")
		scenarios := fs.String("scenarios", "slow,flood", "the scenarios to run, comma-separated: slow, flood, join (slow with c.example starting a quarter into the slowdown)")
		fs.IntVar(&cfg.Sets, "sets", cfg.Sets, "sets (the edge first in odd ones, nginx first in even ones)")
		fs.BoolVar(&cfg.Pin, "pin", cfg.Pin, "run the proxy alone on one CPU, the origin and the clients on the others (needs 2 CPUs)")
		fs.Float64Var(&cfg.OpenShare, "open-share", cfg.OpenShare, "the fixed rate b.example is offered at in the flood (and c.example in join), as a fraction of b.example's closed-loop 200s a second alone")
		fs.IntVar(&cfg.OpenConns, "open-conns", cfg.OpenConns, "connections the fixed-rate client may open")
		fs.DurationVar(&cfg.Deadline, "deadline", cfg.Deadline, "a fixed-rate request not answered 200 within this is lost")
		aPool := fs.String("a-pool", "", "LIMIT,QUEUE,QUEUE_TIMEOUT: a.example gets a pool of its own in a host table, with this concurrency limit (empty: the edge's defaults)")
		_ = fs.Parse(os.Args[2:])
		if *smoke {
			cfg = peerbench.SmokeTenantsConfig()
		}
		cfg.Scenarios = strings.Split(*scenarios, ",")
		if *aPool != "" {
			if cfg.APool, err = peerbench.ParsePoolLimit(*aPool); err != nil {
				break
			}
		}
		if *edgeArgs != "" {
			cfg.EdgeArgs = strings.Fields(*edgeArgs)
		}
		cfg.EdgeBin, cfg.NginxBin = *edge, *nginx
		_, err = peerbench.Tenants(ctx, cfg)
	default:
		err = fmt.Errorf("unknown mode %q: stream, slow, big, requests or tenants", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}
