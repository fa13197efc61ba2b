// Package originsim is the stack's stand-in for a region's origin: a fixed
// number of workers, each taking a fixed service time per request, so its
// capacity (workers / service time requests per second) is known and an
// overload is real. Requests beyond the workers wait in a bounded queue;
// past it they get 503 at once, as an overloaded origin would answer.
package originsim

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config is the origin's capacity.
type Config struct {
	// Workers serve one request each at a time.
	Workers int
	// ServiceTime is how long one request occupies a worker.
	ServiceTime time.Duration
	// Queue is how many requests may wait for a worker; more get 503.
	Queue int
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers: must be ≥ 1 (got %d)", c.Workers))
	}
	if c.ServiceTime < 0 {
		errs = append(errs, fmt.Errorf("service-time: must be ≥ 0 (got %s)", c.ServiceTime))
	}
	if c.Queue < 0 {
		errs = append(errs, fmt.Errorf("queue: must be ≥ 0 (got %d)", c.Queue))
	}
	return errors.Join(errs...)
}

type metrics struct {
	requests *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_originsim_requests_total",
		Help: "Requests the simulated origin received, by outcome (served, rejected).",
	}, []string{"outcome"})}
	reg.MustRegister(m.requests)
	return m
}

// Handler serves the origin: /metrics, /healthz, and every other path as
// one unit of work.
func Handler(cfg Config, reg *prometheus.Registry) http.Handler {
	m := newMetrics(reg)
	workers := make(chan struct{}, cfg.Workers)
	admitted := make(chan struct{}, cfg.Workers+cfg.Queue)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		select {
		case admitted <- struct{}{}:
		default:
			m.requests.WithLabelValues("rejected").Inc()
			w.Header().Set("Retry-After", "1")
			http.Error(w, "origin overloaded", http.StatusServiceUnavailable)
			return
		}
		defer func() { <-admitted }()
		select {
		case workers <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		time.Sleep(cfg.ServiceTime)
		<-workers
		m.requests.WithLabelValues("served").Inc()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = fmt.Fprintf(w, "origin served %s %s\n", r.Method, r.URL.Path)
	})
	return mux
}
