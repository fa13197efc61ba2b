// Command peerbench runs internal/peerbench: the edge's streaming proxy
// beside nginx on loopback (stream), its memory with many slow readers
// (slow) and a very large object through it (big).
//
//	peerbench stream -edge bin/edge -nginx /usr/sbin/nginx [-sets 3] [-clients 8] [-requests 200] [-ttfb-only]
//	peerbench slow -edge bin/edge [-nginx /usr/sbin/nginx] [-clients 1000] [-hold 60s]
//	peerbench big -edge bin/edge [-size 10737418240]
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
		fmt.Fprintln(os.Stderr, "usage: peerbench stream|slow|big [flags]")
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
	default:
		err = fmt.Errorf("unknown mode %q: stream, slow or big", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}
