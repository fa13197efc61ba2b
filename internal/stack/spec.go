// Package stack runs the local multi-region stack that Terraform describes
// (terraform/environments/local): every Terraform resource calls stackctl,
// which starts, health-checks, stops and reconciles the processes of one
// component and keeps their pids, configs and logs in the state directory.
//
// The lifecycle, as Terraform drives it:
//
//  1. `stackctl up KIND` (a create-time provisioner) saves the component's
//     spec under STATE/<id>/spec.json and makes it run: Redis (Cluster or
//     Sentinel, with a redis exporter per node), a Consul server per region
//     (its prepared query `edge`), the region's origin, each edge, Prometheus.
//  2. `stackctl reconcile` (re-run on every apply) walks every saved spec in
//     dependency order, restarts whatever died, pushes the rules with
//     regionctl and returns once every edge is ready and converged — so
//     re-applying after a crash brings the stack back.
//  3. `stackctl down ID` (a destroy-time provisioner) stops a component and
//     removes its directory.
package stack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Kinds of components, in the order reconcile brings them up.
const (
	KindRedis      = "redis"
	KindConsul     = "consul"
	KindOrigin     = "origin"
	KindEdge       = "edge"
	KindPrometheus = "prometheus"
)

var kindOrder = []string{KindRedis, KindConsul, KindOrigin, KindEdge, KindPrometheus}

// Spec is one component as Terraform describes it (the STACK_SPEC
// environment variable of a provisioner, JSON). Only the part of its kind
// is set.
type Spec struct {
	Kind string `json:"kind"`
	// Bin is the directory holding the stack's binaries (edge, regionctl,
	// stackorigin, stackctl).
	Bin string `json:"bin"`

	Redis      *RedisSpec      `json:"redis,omitempty"`
	Consul     *ConsulSpec     `json:"consul,omitempty"`
	Origin     *OriginSpec     `json:"origin,omitempty"`
	Edge       *EdgeSpec       `json:"edge,omitempty"`
	Prometheus *PrometheusSpec `json:"prometheus,omitempty"`
}

// RedisSpec is a region's Redis: a Cluster (Ports: 6 nodes, 3 masters with
// one replica each) or a Sentinel group (Ports: master then replica;
// SentinelPorts: 3 sentinels, quorum 2). Exporters has one port per node.
type RedisSpec struct {
	Region        string `json:"region"`
	Mode          string `json:"mode"` // cluster | sentinel
	Ports         []int  `json:"ports"`
	SentinelPorts []int  `json:"sentinel_ports,omitempty"`
	MasterName    string `json:"master_name,omitempty"`
	ExporterPorts []int  `json:"exporter_ports"`
}

// ConsulSpec is one region's Consul server, its own datacenter.
type ConsulSpec struct {
	Datacenter string `json:"datacenter"`
	HTTP       int    `json:"http"`
	DNS        int    `json:"dns"`
	SerfLAN    int    `json:"serf_lan"`
	SerfWAN    int    `json:"serf_wan"`
	Server     int    `json:"server"`
	// JoinWAN lists the other datacenters' Serf WAN addresses (retried
	// until they answer, also after a restart).
	JoinWAN []string `json:"join_wan"`
	// Failover is the prepared query's explicit datacenter list.
	Failover []string `json:"failover"`
	// Query is the prepared query's name ("edge"); Service the edges'.
	Query   string `json:"query"`
	Service string `json:"service"`
}

// OriginSpec is a region's origin: Workers requests at a time, each taking
// ServiceTime, so capacity is Workers/ServiceTime requests per second.
type OriginSpec struct {
	Region      string `json:"region"`
	Port        int    `json:"port"`
	Workers     int    `json:"workers"`
	ServiceTime string `json:"service_time"`
	Queue       int    `json:"queue"`
}

// EdgeSpec is one edge node.
type EdgeSpec struct {
	Name          string   `json:"name"` // <region>-<pop>-<n>
	Region        string   `json:"region"`
	PoP           string   `json:"pop"`
	Addr          string   `json:"addr"` // 127.0.R.E
	Port          int      `json:"port"`
	TLSPort       int      `json:"tls_port,omitempty"` // HTTPS (h2, http/1.1) with the stack's certificate from Consul
	AdminPort     int      `json:"admin_port"`
	RLSPort       int      `json:"rls_port,omitempty"` // Envoy's rate limit service (gRPC), documents from the region's Consul
	Redis         string   `json:"redis"`
	RedisMode     string   `json:"redis_mode"`
	RedisTimeout  string   `json:"redis_timeout,omitempty"`
	Consul        string   `json:"consul"` // host:port of the region's agent
	Origin        string   `json:"origin"`
	KeySalt       string   `json:"key_salt"`
	NodesInRegion int      `json:"nodes_in_region"`
	NodesInPoP    int      `json:"nodes_in_pop"`
	Workers       int      `json:"workers,omitempty"`
	ExtraArgs     []string `json:"extra_args,omitempty"`
}

// PrometheusSpec is the stack's Prometheus.
type PrometheusSpec struct {
	Port           int                 `json:"port"`
	ScrapeInterval string              `json:"scrape_interval"`
	Consuls        map[string]string   `json:"consuls"`   // datacenter → HTTP host:port
	Exporters      map[string][]string `json:"exporters"` // region → exporter host:port
	Service        string              `json:"service"`
	AdminPort      int                 `json:"admin_port"`
}

// The ids of components, their directories in the state dir. These are
// their only spellings: Terraform hands stackctl the spec (up and down alike)
// and the drills name what they kill or bring back with these.
func RedisID(region string) string  { return KindRedis + "-" + region }
func ConsulID(dc string) string     { return KindConsul + "-" + dc }
func OriginID(region string) string { return KindOrigin + "-" + region }
func EdgeID(name string) string     { return KindEdge + "-" + name }

// PrometheusID is the stack's one Prometheus.
const PrometheusID = KindPrometheus

// ID names the component's directory in the state dir.
func (s Spec) ID() string {
	switch s.Kind {
	case KindRedis:
		return RedisID(s.Redis.Region)
	case KindConsul:
		return ConsulID(s.Consul.Datacenter)
	case KindOrigin:
		return OriginID(s.Origin.Region)
	case KindEdge:
		return EdgeID(s.Edge.Name)
	case KindPrometheus:
		return PrometheusID
	}
	return ""
}

// ParseSpec reads and checks a spec.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("parsing spec: %w", err)
	}
	return s, s.Validate()
}

// Validate reports every problem at once.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Bin == "" {
		bad("bin: required")
	}
	set := 0
	for _, p := range []bool{s.Redis != nil, s.Consul != nil, s.Origin != nil, s.Edge != nil, s.Prometheus != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		bad("exactly one of redis, consul, origin, edge, prometheus must be set (got %d)", set)
	}
	switch {
	case s.Kind == KindRedis && s.Redis != nil:
		r := s.Redis
		switch r.Mode {
		case "cluster":
			if len(r.Ports) != 6 {
				bad("redis.ports: a cluster has 6 nodes (got %d)", len(r.Ports))
			}
		case "sentinel":
			if len(r.Ports) != 2 || len(r.SentinelPorts) != 3 || r.MasterName == "" {
				bad("redis: a sentinel group has 2 ports, 3 sentinel_ports and a master_name")
			}
		default:
			bad("redis.mode: cluster or sentinel (got %q)", r.Mode)
		}
		if len(r.ExporterPorts) != len(r.Ports) {
			bad("redis.exporter_ports: one per node (got %d for %d nodes)", len(r.ExporterPorts), len(r.Ports))
		}
		if r.Region == "" {
			bad("redis.region: required")
		}
	case s.Kind == KindConsul && s.Consul != nil:
		c := s.Consul
		if c.Datacenter == "" || c.Query == "" || c.Service == "" {
			bad("consul: datacenter, query and service are required")
		}
		if slices.Contains([]int{c.HTTP, c.DNS, c.SerfLAN, c.SerfWAN, c.Server}, 0) {
			bad("consul: every port is required")
		}
	case s.Kind == KindOrigin && s.Origin != nil:
		o := s.Origin
		if o.Port == 0 || o.Workers < 1 || o.ServiceTime == "" {
			bad("origin: port, workers ≥ 1 and service_time are required")
		}
	case s.Kind == KindEdge && s.Edge != nil:
		e := s.Edge
		if e.Name == "" || e.Region == "" || e.PoP == "" || e.Addr == "" || e.Port == 0 || e.AdminPort == 0 {
			bad("edge: name, region, pop, addr, port and admin_port are required")
		}
		if e.Origin == "" || e.KeySalt == "" || e.Consul == "" {
			bad("edge: origin, key_salt and consul are required")
		}
	case s.Kind == KindPrometheus && s.Prometheus != nil:
		if s.Prometheus.Port == 0 {
			bad("prometheus.port: required")
		}
	default:
		bad("kind %q does not match the part set", s.Kind)
	}
	return errors.Join(errs...)
}

// State is the stack's state directory.
type State struct{ Dir string }

func (st State) componentDir(id string) string { return filepath.Join(st.Dir, id) }

// save records spec so reconcile can bring the component back.
func (st State) save(s Spec) error {
	dir := st.componentDir(s.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "spec.json"), data, 0o644)
}

// Specs returns every saved spec, in the order reconcile brings them up.
func (st State) Specs() ([]Spec, error) {
	paths, err := filepath.Glob(filepath.Join(st.Dir, "*", "spec.json"))
	if err != nil {
		return nil, err
	}
	var specs []Spec
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		s, err := ParseSpec(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		specs = append(specs, s)
	}
	slices.SortStableFunc(specs, func(a, b Spec) int {
		if d := slices.Index(kindOrder, a.Kind) - slices.Index(kindOrder, b.Kind); d != 0 {
			return d
		}
		return strings.Compare(a.ID(), b.ID())
	})
	return specs, nil
}
