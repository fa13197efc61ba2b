// Command stackorigin is the local stack's origin for one region: workers ×
// service time, so its capacity is known; PUT /capacity changes both while
// it serves (see package originsim), e.g.
//
//	curl -X PUT -d '{"workers": 4}' http://127.0.0.1:18081/capacity
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/stack/originsim"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18080", "listen address")
	var cfg originsim.Config
	flag.IntVar(&cfg.Workers, "workers", 32, "requests served at once")
	flag.DurationVar(&cfg.ServiceTime, "service-time", 5*time.Millisecond, "time one request occupies a worker")
	flag.IntVar(&cfg.Queue, "queue", 64, "requests that may wait for a worker; more get 503")
	flag.Parse()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "stackorigin:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	srv := &http.Server{Addr: *listen, Handler: originsim.Handler(cfg, prometheus.NewRegistry()), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("origin serving", "listen", *listen, "workers", cfg.Workers, "service_time", cfg.ServiceTime, "queue", cfg.Queue)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("origin failed", "err", err)
		os.Exit(1)
	}
}
