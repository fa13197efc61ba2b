// Package originsim is the stack's stand-in for a region's origin: a number
// of workers, each taking a fixed service time per request, so its capacity
// (workers / service time requests per second) is known and an overload is
// real. Requests beyond the workers wait in a bounded queue; past it they
// get 503 at once, as an overloaded origin would answer.
//
// The capacity can change while it serves (PUT /capacity), as a real
// origin's does when it loses instances or a dependency slows down: a load
// test halves it mid-run and watches the edges follow.
package originsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
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

// Capacity is the body of GET and PUT /capacity. In a PUT, a field left
// out (zero) keeps its value.
type Capacity struct {
	Workers     int    `json:"workers"`
	ServiceTime string `json:"service_time"`
	// RPS is workers / service time (0 for a zero service time); ignored
	// in a PUT.
	RPS float64 `json:"capacity_rps"`
}

type metrics struct {
	requests *prometheus.CounterVec
	capacity prometheus.Gauge
	workers  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_originsim_requests_total",
			Help: "Requests the simulated origin received, by outcome (served, rejected).",
		}, []string{"outcome"}),
		capacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_originsim_capacity_rps",
			Help: "Requests per second the simulated origin serves at most now (workers / service time).",
		}),
		workers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_originsim_workers",
			Help: "The simulated origin's workers now.",
		}),
	}
	reg.MustRegister(m.requests, m.capacity, m.workers)
	return m
}

// Origin is the simulated origin; Handler serves it over HTTP.
type Origin struct {
	m       *metrics
	pool    *pool
	service atomic.Int64 // time.Duration
}

// New returns an origin of cfg's capacity, its metrics registered in reg.
func New(cfg Config, reg prometheus.Registerer) *Origin {
	o := &Origin{m: newMetrics(reg), pool: newPool(cfg.Workers, cfg.Queue)}
	o.service.Store(int64(cfg.ServiceTime))
	o.exportCapacity()
	return o
}

// Capacity is the origin's capacity now.
func (o *Origin) Capacity() Capacity {
	workers, service := o.pool.workers(), time.Duration(o.service.Load())
	c := Capacity{Workers: workers, ServiceTime: service.String()}
	if service > 0 {
		c.RPS = float64(workers) / service.Seconds()
	}
	return c
}

// SetCapacity changes the workers and the service time (a zero value keeps
// the current one). Fewer workers take effect as requests finish: the ones
// being served are not interrupted.
func (o *Origin) SetCapacity(workers int, service time.Duration) error {
	if workers < 0 || service < 0 {
		return fmt.Errorf("capacity: workers and service time must be ≥ 0 (got %d, %s)", workers, service)
	}
	if workers > 0 {
		o.pool.resize(workers)
	}
	if service > 0 {
		o.service.Store(int64(service))
	}
	o.exportCapacity()
	return nil
}

func (o *Origin) exportCapacity() {
	c := o.Capacity()
	o.m.workers.Set(float64(c.Workers))
	o.m.capacity.Set(c.RPS)
}

// serve is one unit of work: a place in the queue, a worker, the service
// time.
func (o *Origin) serve(w http.ResponseWriter, r *http.Request) {
	if !o.pool.enter() {
		o.m.requests.WithLabelValues("rejected").Inc()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "origin overloaded", http.StatusServiceUnavailable)
		return
	}
	if !o.pool.acquire(r.Context().Done()) {
		return
	}
	time.Sleep(time.Duration(o.service.Load()))
	o.pool.release()
	o.m.requests.WithLabelValues("served").Inc()
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprintf(w, "origin served %s %s\n", r.Method, r.URL.Path)
}

func (o *Origin) capacityHandler(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut {
		var c Capacity
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			http.Error(w, "capacity: "+err.Error(), http.StatusBadRequest)
			return
		}
		var service time.Duration
		if c.ServiceTime != "" {
			d, err := time.ParseDuration(c.ServiceTime)
			if err != nil {
				http.Error(w, "capacity: service_time: "+err.Error(), http.StatusBadRequest)
				return
			}
			service = d
		}
		if err := o.SetCapacity(c.Workers, service); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(o.Capacity())
}

// Handler serves the origin: /metrics, /healthz, GET and PUT /capacity,
// and every other path as one unit of work.
func (o *Origin) Handler(reg prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /capacity", o.capacityHandler)
	mux.HandleFunc("PUT /capacity", o.capacityHandler)
	mux.HandleFunc("/", o.serve)
	return mux
}

// Handler serves an origin of cfg's capacity (see Origin.Handler).
func Handler(cfg Config, reg *prometheus.Registry) http.Handler {
	return New(cfg, reg).Handler(reg)
}

// pool is the origin's workers and queue: at most size requests served at
// once, in arrival order, and at most size+queue in the origin at all. Its
// size can change while requests wait.
type pool struct {
	mu      sync.Mutex
	size    int
	queue   int
	inside  int // entered and not yet released (or given up)
	busy    int
	waiters []chan struct{}
}

func newPool(size, queue int) *pool { return &pool{size: size, queue: queue} }

func (p *pool) workers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size
}

// enter takes a place in the origin, or reports that it is full.
func (p *pool) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inside >= p.size+p.queue {
		return false
	}
	p.inside++
	return true
}

// acquire waits for a worker, in arrival order, until done is closed (then
// it leaves the origin and reports false).
func (p *pool) acquire(done <-chan struct{}) bool {
	p.mu.Lock()
	if p.busy < p.size && len(p.waiters) == 0 {
		p.busy++
		p.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	p.waiters = append(p.waiters, ch)
	p.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-done:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range p.waiters {
		if w == ch {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			p.inside--
			return false
		}
	}
	// Granted while giving up: hand the worker on.
	p.busy--
	p.inside--
	p.grant()
	return false
}

// release frees a worker and leaves the origin.
func (p *pool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy--
	p.inside--
	p.grant()
}

func (p *pool) resize(size int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.size = size
	p.grant()
}

// grant hands free workers to the longest waiters; p.mu is held.
func (p *pool) grant() {
	for p.busy < p.size && len(p.waiters) > 0 {
		close(p.waiters[0])
		p.waiters = p.waiters[1:]
		p.busy++
	}
}
