package stack

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

// consulServer is one region's Consul: a single server (bootstrap_expect 1)
// keeping its data in dir, so a restart keeps the KV documents, the
// prepared query and the catalog.
type consulServer struct {
	spec ConsulSpec
	dir  string
}

func (c consulServer) daemon(bin string) proc.Daemon {
	return proc.Daemon{Name: "consul", Dir: c.dir, Bin: bin,
		Args: []string{"agent", "-config-file=" + filepath.Join(c.dir, "consul.hcl")},
		Env:  []string{"TMPDIR=" + c.dir}}
}

func (c consulServer) httpAddr() string { return addr(c.spec.HTTP) }

// config renders the agent's HCL. Every listener is on 127.0.0.1; gRPC is
// off (nothing uses it); the WAN joins are retried forever, so a restarted
// server finds the other datacenters again by itself.
func (c consulServer) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "datacenter = %q\nnode_name = %q\ndata_dir = %q\n", c.spec.Datacenter, ConsulID(c.spec.Datacenter), filepath.Join(c.dir, "data"))
	b.WriteString(`server = true
bootstrap_expect = 1
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
advertise_addr = "127.0.0.1"
advertise_addr_wan = "127.0.0.1"
log_level = "warn"
disable_update_check = true
leave_on_terminate = false
ui_config { enabled = false }
performance { raft_multiplier = 1 }
`)
	fmt.Fprintf(&b, "ports {\n  http = %d\n  https = -1\n  dns = %d\n  grpc = -1\n  grpc_tls = -1\n  serf_lan = %d\n  serf_wan = %d\n  server = %d\n}\n",
		c.spec.HTTP, c.spec.DNS, c.spec.SerfLAN, c.spec.SerfWAN, c.spec.Server)
	if len(c.spec.JoinWAN) > 0 {
		q := make([]string, len(c.spec.JoinWAN))
		for i, a := range c.spec.JoinWAN {
			q[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&b, "retry_join_wan = [%s]\nretry_interval_wan = \"1s\"\n", strings.Join(q, ", "))
	}
	return b.String()
}

func (c consulServer) client() (*api.Client, error) {
	return api.NewClient(&api.Config{
		Address:    c.httpAddr(),
		Scheme:     "http",
		HttpClient: &http.Client{Timeout: 5 * time.Second},
		TokenFile:  os.DevNull,
	})
}

// ensureConsul starts the server unless it runs, waits for its leader and
// writes the prepared query.
func ensureConsul(ctx context.Context, c consulServer) error {
	bin, err := servers.Consul()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "consul.hcl"), []byte(c.config()), 0o644); err != nil {
		return err
	}
	p := c.daemon(bin)
	if _, err := p.Ensure(); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	err = p.WaitAlive(ctx, "consul "+c.spec.Datacenter+" to elect a leader", func(ctx context.Context) error {
		leader, err := cl.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return err
		}
		if leader == "" {
			return fmt.Errorf("no leader")
		}
		// The catalog answers once the leader has synced itself in.
		_, _, err = cl.Catalog().Nodes((&api.QueryOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return fmt.Errorf("consul %s: %w", c.spec.Datacenter, err)
	}
	return proc.Poll(ctx, "prepared query in "+c.spec.Datacenter, func(ctx context.Context) error {
		return upsertQuery(ctx, cl, c.spec)
	})
}

// upsertQuery creates or updates the prepared query that the DNS routing
// follows: healthy edges only, the region's own first, then the explicit
// failover datacenters in order; TTL 0 so resolvers ask again each time.
func upsertQuery(ctx context.Context, cl *api.Client, s ConsulSpec) error {
	def := &api.PreparedQueryDefinition{
		Name: s.Query,
		Service: api.ServiceQuery{
			Service:     s.Service,
			OnlyPassing: true,
			Failover:    api.QueryFailoverOptions{Datacenters: s.Failover},
		},
		DNS: api.QueryDNSOptions{TTL: "0s"},
	}
	q := (&api.QueryOptions{}).WithContext(ctx)
	existing, _, err := cl.PreparedQuery().List(q)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(existing, func(d *api.PreparedQueryDefinition) bool { return d.Name == s.Query })
	if i >= 0 {
		def.ID = existing[i].ID
		_, err = cl.PreparedQuery().Update(def, (&api.WriteOptions{}).WithContext(ctx))
		return err
	}
	_, _, err = cl.PreparedQuery().Create(def, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

// waitWAN waits until every agent lists every datacenter and forwards to
// it.
func waitWAN(ctx context.Context, servers []consulServer) error {
	var dcs []string
	for _, s := range servers {
		dcs = append(dcs, s.spec.Datacenter)
	}
	for _, s := range servers {
		cl, err := s.client()
		if err != nil {
			return err
		}
		err = proc.Poll(ctx, "consul "+s.spec.Datacenter+" to reach every datacenter over WAN", func(ctx context.Context) error {
			known, err := cl.Catalog().Datacenters()
			if err != nil {
				return err
			}
			for _, dc := range dcs {
				if !slices.Contains(known, dc) {
					return fmt.Errorf("lists %v, not %s", known, dc)
				}
				q := (&api.QueryOptions{Datacenter: dc}).WithContext(ctx)
				if leader, err := cl.Status().LeaderWithQueryOptions(q); err != nil || leader == "" {
					return fmt.Errorf("forwarding to %s: leader %q, %v", dc, leader, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
