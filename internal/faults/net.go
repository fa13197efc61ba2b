// Package faults puts a fault-injection proxy between an edge's Redis client
// and Redis, so tests can slow, cut, black-hole or reset the edge's link to
// its region's Redis and watch what the limiter decides meanwhile.
//
// The proxy is Shopify's toxiproxy, run in this process: one Net per edge,
// and in a Net one proxy per Redis address the edge dials. A go-redis client
// built with Net.Dial as its Dialer keeps the real addresses (a Cluster's
// CLUSTER SLOTS and MOVED replies, a Sentinel's master address) and reaches
// each of them through its proxy, created on first dial: no proxy address is
// ever announced to Redis, so Cluster and Sentinel need no harness support.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Toxic is one of toxiproxy's faults: Type is latency, bandwidth,
// reset_peer, timeout, slow_close or limit_data; Stream is upstream (edge →
// Redis) or downstream (Redis → edge); Attributes are the toxic's own
// (latency: latency, jitter in ms; bandwidth: rate in KB/s; timeout,
// reset_peer: timeout in ms; slow_close: delay in ms).
type Toxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Attributes map[string]any `json:"attributes"`
}

// Net is one edge's way to Redis: a proxy per Redis address, every proxy
// carrying the same toxics.
type Net struct {
	mu      sync.Mutex
	server  *toxiproxy.ApiServer
	proxies map[string]*toxiproxy.Proxy // by upstream address
	toxics  []Toxic
	cut     bool
	closed  bool
}

// NewNet returns a Net with no proxies yet.
func NewNet() *Net {
	return &Net{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// Dial is a go-redis Dialer: it connects to addr through addr's proxy.
func (n *Net) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	listen, err := n.proxy(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: time.Second}
	return d.DialContext(ctx, network, listen)
}

// Listen returns the address that reaches addr through its proxy, for a
// client in another process (one that cannot take Dial as its dialer).
func (n *Net) Listen(addr string) (string, error) { return n.proxy(addr) }

// proxy returns the listen address of addr's proxy, starting it with the
// Net's current toxics if it is new.
func (n *Net) proxy(addr string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return "", fmt.Errorf("faults: dialing %s: net closed", addr)
	}
	if p, ok := n.proxies[addr]; ok {
		return p.Listen, nil
	}
	p := toxiproxy.NewProxy(n.server, addr, "127.0.0.1:0", addr)
	if !n.cut {
		if err := p.Start(); err != nil {
			return "", fmt.Errorf("faults: proxying %s: %w", addr, err)
		}
	} else {
		// Reserve an address so the proxy can start on it when restored.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("faults: proxying %s: %w", addr, err)
		}
		p.Listen = l.Addr().String()
		_ = l.Close()
	}
	for _, t := range n.toxics {
		if err := addToxic(p, t); err != nil {
			p.Stop()
			return "", err
		}
	}
	n.proxies[addr] = p
	return p.Listen, nil
}

func addToxic(p *toxiproxy.Proxy, t Toxic) error {
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("faults: encoding toxic %s: %w", t.Name, err)
	}
	if _, err := p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
		return fmt.Errorf("faults: adding toxic %s to %s: %w", t.Name, p.Upstream, err)
	}
	return nil
}

// Add puts t on every proxy, those of live connections included, and on
// every proxy started later.
func (n *Net) Add(t Toxic) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.proxies {
		if err := addToxic(p, t); err != nil {
			return err
		}
	}
	n.toxics = append(n.toxics, t)
	return nil
}

// Remove takes the toxic named name off every proxy. Data a latency toxic
// holds is let through at once, so a test can hold Redis's replies and
// release them when it chooses.
func (n *Net) Remove(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.proxies {
		if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			return fmt.Errorf("faults: removing toxic %s from %s: %w", name, p.Upstream, err)
		}
	}
	n.toxics = slices.DeleteFunc(n.toxics, func(t Toxic) bool { return t.Name == name })
	return nil
}

// Clear removes every toxic.
func (n *Net) Clear() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.proxies {
		p.Toxics.ResetToxics(context.Background())
	}
	n.toxics = nil
}

// Cut takes the link down: every proxy closes its connections and stops
// listening, so connections are reset and new ones refused, as when Redis
// restarts or the network partitions.
func (n *Net) Cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = true
	for _, p := range n.proxies {
		p.Stop()
	}
}

// Restore brings a cut link back on the same addresses.
func (n *Net) Restore() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = false
	for addr, p := range n.proxies {
		if err := p.Start(); err != nil {
			return fmt.Errorf("faults: restoring proxy of %s on %s: %w", addr, p.Listen, err)
		}
	}
	return nil
}

// Close stops every proxy; later dials fail.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, p := range n.proxies {
		p.Stop()
	}
}
