package region

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Registration is one edge in the catalog.
type Registration struct {
	ID           string // unique per edge process
	Region, PoP  string
	Address      string // public address ("" = the agent's node address)
	Port         int
	RulesVersion string
	// ShedderVersion is the version of the shedder settings in force
	// (shedder.SettingsVersion; meta shedder_version).
	ShedderVersion string
	// HostsVersion is the version of the host table in force ("" none;
	// meta hosts_version).
	HostsVersion string
	// GlobalShare lists the home regions the edge cannot reach: their
	// global rules' keys are decided from the static share.
	GlobalShare []string
	// Version is the binary's release version (meta version); the
	// schemas it reads are DocumentSchemas' (meta schema_<kind>).
	Version string
	// CheckURL is polled by the local agent (the edge's /readyz).
	CheckURL      string
	CheckInterval time.Duration
}

// Register adds or updates the edge in the local agent's catalog. Calling it
// again with a new RulesVersion updates the service's meta.
func (c *Client) Register(ctx context.Context, r Registration) error {
	interval := r.CheckInterval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	reg := &api.AgentServiceRegistration{
		ID:      r.ID,
		Name:    Service,
		Address: r.Address,
		Port:    r.Port,
		Meta:    r.meta(),
		Check: &api.AgentServiceCheck{
			CheckID:                        r.ID + ":readyz",
			HTTP:                           r.CheckURL,
			Interval:                       interval.String(),
			Timeout:                        "2s",
			DeregisterCriticalServiceAfter: "10m",
		},
	}
	err := c.api.Agent().ServiceRegisterOpts(reg, api.ServiceRegisterOpts{}.WithContext(ctx))
	return classify("registering "+r.ID, err)
}

func (r Registration) meta() map[string]string {
	m := map[string]string{"region": r.Region, "pop": r.PoP, "rules_version": r.RulesVersion,
		"shedder_version": r.ShedderVersion, "hosts_version": r.HostsVersion,
		"global_share": strings.Join(r.GlobalShare, ","), metaVersion: r.Version}
	for kind, n := range DocumentSchemas.Reads() {
		m[metaSchemaPrefix+kind] = strconv.Itoa(n)
	}
	return m
}

// RLSRegistration is one edge's rate limit service in the catalog.
type RLSRegistration struct {
	ID          string // unique per edge process
	Region, PoP string
	Address     string // public address ("" = the agent's node address)
	Port        int
	// Edge is the ID of the edge's own registration (meta edge): its
	// metrics and the service's are one target's.
	Edge string
	// MetricsPort is the edge's admin port, on Address: the service's
	// metrics are the edge's /metrics (meta metrics_port, for discovery).
	MetricsPort int
	// CheckAddr is the host:port the local agent's gRPC health check
	// dials (grpc.health.v1, the rate limit service by name); TLS says
	// whether it speaks TLS there.
	CheckAddr     string
	TLS           bool
	CheckInterval time.Duration
}

// RegisterRLS adds or updates an edge's rate limit service in the local
// agent's catalog. Its check passes while the service answers SERVING: it
// has documents and is not draining.
func (c *Client) RegisterRLS(ctx context.Context, r RLSRegistration) error {
	interval := r.CheckInterval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	reg := &api.AgentServiceRegistration{
		ID:      r.ID,
		Name:    RLSService,
		Address: r.Address,
		Port:    r.Port,
		Meta:    map[string]string{"region": r.Region, "pop": r.PoP, "edge": r.Edge, "metrics_port": strconv.Itoa(r.MetricsPort)},
		Check: &api.AgentServiceCheck{
			CheckID:    r.ID + ":grpc",
			GRPC:       r.CheckAddr + "/envoy.service.ratelimit.v3.RateLimitService",
			GRPCUseTLS: r.TLS,
			// The check asks whether the service answers, not who it is:
			// the agent holds no CA of the service's.
			TLSSkipVerify:                  r.TLS,
			Interval:                       interval.String(),
			Timeout:                        "2s",
			DeregisterCriticalServiceAfter: "10m",
		},
	}
	err := c.api.Agent().ServiceRegisterOpts(reg, api.ServiceRegisterOpts{}.WithContext(ctx))
	return classify("registering "+r.ID, err)
}

// Deregister removes the edge from the catalog.
func (c *Client) Deregister(ctx context.Context, id string) error {
	err := c.api.Agent().ServiceDeregisterOpts(id, (&api.QueryOptions{}).WithContext(ctx))
	return classify("deregistering "+id, err)
}

// Edge is one registered edge as the catalog reports it.
type Edge struct {
	ID, Node, Address string
	Region, PoP       string
	RulesVersion      string
	ShedderVersion    string // "" for edges that did not register one
	HostsVersion      string // "" for edges without a host table or that did not register one
	Healthy           bool
	// GlobalShare: the home regions the edge reported unreachable.
	GlobalShare []string
	// Version is the edge's release version ("" for edges of 0.1.0,
	// which did not register one).
	Version string
	// Schemas are the document schemas the edge reads, by kind (see
	// Reads); empty for edges of 0.1.0.
	Schemas map[string]int
}

// Edges lists the edges registered in region's datacenter. index > 0 makes
// it a blocking query that returns once the list changes (or after wait).
func (c *Client) Edges(ctx context.Context, region string, index uint64, wait time.Duration) ([]Edge, uint64, error) {
	q := (&api.QueryOptions{Datacenter: region, WaitIndex: index, WaitTime: wait}).WithContext(ctx)
	entries, meta, err := c.api.Health().Service(Service, "", false, q)
	if err != nil {
		return nil, 0, classifyIn(region, "listing edges of "+region, err)
	}
	if err := filtered("listing edges of "+region, meta); err != nil {
		return nil, 0, err
	}
	out := make([]Edge, 0, len(entries))
	for _, e := range entries {
		addr := e.Service.Address
		if addr == "" {
			addr = e.Node.Address
		}
		out = append(out, Edge{
			ID:             e.Service.ID,
			Node:           e.Node.Node,
			Address:        net.JoinHostPort(addr, strconv.Itoa(e.Service.Port)),
			Region:         e.Service.Meta["region"],
			PoP:            e.Service.Meta["pop"],
			RulesVersion:   e.Service.Meta["rules_version"],
			ShedderVersion: e.Service.Meta["shedder_version"],
			HostsVersion:   e.Service.Meta["hosts_version"],
			Healthy:        e.Checks.AggregatedStatus() == api.HealthPassing,
			GlobalShare:    splitList(e.Service.Meta["global_share"]),
			Version:        e.Service.Meta[metaVersion],
			Schemas:        schemaMeta(e.Service.Meta),
		})
	}
	return out, meta.LastIndex, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// Count is how many healthy edges a region and one of its PoPs run.
func Count(edges []Edge, region, pop string) (inRegion, inPoP int) {
	for _, e := range edges {
		if !e.Healthy || e.Region != region {
			continue
		}
		inRegion++
		if e.PoP == pop {
			inPoP++
		}
	}
	return inRegion, inPoP
}

// String is for logs.
func (e Edge) String() string {
	return fmt.Sprintf("%s (%s/%s, rules %s, healthy %t)", e.ID, e.Region, e.PoP, e.RulesVersion, e.Healthy)
}
