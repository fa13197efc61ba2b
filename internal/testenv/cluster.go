package testenv

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

const (
	clusterMasters  = 3
	clusterReplicas = 3
	clusterSlots    = 16384
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// NodeTimeout is cluster-node-timeout: how long a node may be
	// unreachable before it is failed over. Default 1s, which keeps
	// failover tests quick.
	NodeTimeout time.Duration
}

// Cluster is a Redis Cluster of 3 masters with one replica each.
type Cluster struct {
	d     *deployment
	nodes []*process // in start order
}

// StartCluster starts six nodes, joins them with redis-cli --cluster create
// and returns once every node agrees on the slot map and every replica has
// synced with its master.
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = time.Second
	}
	bin, err := servers.Lookup("redis-server")
	if err != nil {
		return nil, err
	}
	cli, err := servers.Lookup("redis-cli")
	if err != nil {
		return nil, err
	}
	d, err := newDeployment("cluster")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting cluster: %w", err)
	}
	c := &Cluster{d: d}
	if err := c.start(opts, bin, cli); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting cluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) start(opts ClusterOptions, bin, cli string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	for range clusterMasters + clusterReplicas {
		p, err := c.d.spawn(ctx, spec{
			name: "node",
			bin:  bin,
			// The bus port gets a port of its own rather than the implicit
			// port+10000, which nobody checked to be free.
			extraPorts: 1,
			config: func(ports []int) string {
				return strings.Join([]string{
					"cluster-enabled yes",
					"cluster-port " + strconv.Itoa(ports[1]),
					"cluster-config-file " + servers.Quote(filepath.Join(c.d.dir, fmt.Sprintf("nodes-%d.conf", ports[0]))),
					"cluster-node-timeout " + strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
					// Replicas that lost their master a while ago must still
					// be promotable, or failover tests would depend on timing.
					"cluster-replica-validity-factor 0",
				}, "\n")
			},
		})
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, p)
	}

	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = proc.SysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("running redis-cli --cluster create: %w\n%s", err, out)
	}

	// redis-cli returns once the nodes agree on config epochs; slot and
	// replica gossip reaches every node a few seconds later.
	return proc.Poll(ctx, "cluster to converge", func(ctx context.Context) error {
		return c.check(ctx, true)
	})
}

// Addrs returns the addresses of all six nodes, dead or alive.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		addrs[i] = p.addr
	}
	return addrs
}

// URL returns a go-redis cluster URL (for redis.ParseClusterURL) listing
// every node as a seed.
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	return "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
}

// Masters returns the sorted addresses of the live masters, as seen by a
// live node.
func (c *Cluster) Masters(ctx context.Context) ([]string, error) {
	nodes, err := c.liveView(ctx)
	if err != nil {
		return nil, fmt.Errorf("testenv: listing masters: %w", err)
	}
	var masters []string
	for _, n := range nodes {
		if n.is("master") && n.usable() && c.alive(n.addr) {
			masters = append(masters, n.addr)
		}
	}
	slices.Sort(masters)
	return masters, nil
}

// MasterForKey returns the live master currently serving key's slot.
func (c *Cluster) MasterForKey(ctx context.Context, key string) (string, error) {
	var (
		slot  int64
		nodes []clusterNode
	)
	err := c.onLiveNode(ctx, func(ctx context.Context, cl *redis.Client) error {
		var err error
		if slot, err = cl.ClusterKeySlot(ctx, key).Result(); err != nil {
			return fmt.Errorf("querying CLUSTER KEYSLOT: %w", err)
		}
		nodes, err = clusterView(ctx, cl)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("testenv: finding master for key %q: %w", key, err)
	}
	owner := slotOwners(nodes)[slot]
	if owner == "" || !c.alive(owner) {
		return "", fmt.Errorf("testenv: finding master for key %q: slot %d is not served by a live master", key, slot)
	}
	return owner, nil
}

// KillNode SIGKILLs the node at addr, as a crash would, and returns once the
// process is gone. Killing a dead node is a no-op.
func (c *Cluster) KillNode(addr string) error {
	p := c.node(addr)
	if p == nil {
		return fmt.Errorf("testenv: killing node: no cluster node at %s", addr)
	}
	p.kill()
	return nil
}

// WaitHealthy waits until every live node reports cluster_state:ok and sees
// all slots served by the same live masters. Without a deadline on ctx it
// gives up after 30s.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	err := proc.Poll(ctx, "cluster to be healthy", func(ctx context.Context) error {
		return c.check(ctx, false)
	})
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// KillMasterAndWaitFailover kills the master at addr, waits until a replica
// has taken over its slots and the cluster is healthy again, and returns the
// new master's address. Without a deadline on ctx it gives up after 30s.
//
// A go-redis ClusterClient does not reload its slot map when a node refuses
// connections, only on redirects and every ClusterStateReloadInterval
// (default 60s): clients that should recover within a test need a short one.
func (c *Cluster) KillMasterAndWaitFailover(ctx context.Context, addr string) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()

	nodes, err := c.liveView(ctx)
	if err != nil {
		return "", fmt.Errorf("testenv: failing over %s: %w", addr, err)
	}
	i := slices.IndexFunc(nodes, func(n clusterNode) bool { return n.addr == addr })
	if i < 0 || !nodes[i].is("master") || !nodes[i].usable() || len(nodes[i].slots) == 0 {
		return "", fmt.Errorf("testenv: failing over %s: not a live master serving slots", addr)
	}
	old := nodes[i]
	if err := c.KillNode(addr); err != nil {
		return "", err
	}

	var newMaster string
	err = proc.Poll(ctx, "failover of "+addr, func(ctx context.Context) error {
		nodes, err := c.liveView(ctx)
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(nodes, func(n clusterNode) bool { return n.id == old.id }); i >= 0 && !nodes[i].is("fail") {
			return fmt.Errorf("%s not yet marked as failed (flags %s)", addr, strings.Join(nodes[i].flags, ","))
		}
		owners := slotOwners(nodes)
		newMaster = owners[old.slots[0][0]]
		if newMaster == "" || !c.alive(newMaster) {
			return fmt.Errorf("slot %d not yet served by a live master", old.slots[0][0])
		}
		for _, r := range old.slots {
			for slot := r[0]; slot <= r[1]; slot++ {
				if owners[slot] != newMaster {
					return fmt.Errorf("slot %d not yet taken over by %s", slot, newMaster)
				}
			}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("testenv: failing over %s: %w", addr, err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return "", fmt.Errorf("testenv: failing over %s: %w", addr, err)
	}
	return newMaster, nil
}

// Close kills every node and removes the cluster's files. It is idempotent.
func (c *Cluster) Close() error {
	return c.d.Close()
}

func (c *Cluster) node(addr string) *process {
	for _, p := range c.nodes {
		if p.addr == addr {
			return p
		}
	}
	return nil
}

func (c *Cluster) alive(addr string) bool {
	p := c.node(addr)
	return p != nil && p.alive()
}

// onLiveNode runs fn against live nodes in turn until one succeeds, so
// queries keep working while some nodes are down.
func (c *Cluster) onLiveNode(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	var errs []error
	for _, p := range c.nodes {
		if !p.alive() {
			continue
		}
		err := withClient(ctx, p.addr, fn)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", p.addr, err))
	}
	if len(errs) == 0 {
		return errors.New("no live cluster nodes")
	}
	return errors.Join(errs...)
}

func (c *Cluster) liveView(ctx context.Context) ([]clusterNode, error) {
	var nodes []clusterNode
	err := c.onLiveNode(ctx, func(ctx context.Context, cl *redis.Client) error {
		var err error
		nodes, err = clusterView(ctx, cl)
		return err
	})
	return nodes, err
}

// check returns nil if every live node reports cluster_state:ok and maps
// every slot to the same live masters. At startup it also requires every
// node to know all others and every replica to have synced, so that a later
// failover is quick and loses no acknowledged writes.
func (c *Cluster) check(ctx context.Context, startup bool) error {
	var ref []string
	replicas := 0
	for _, p := range c.nodes {
		if !p.alive() {
			continue
		}
		err := withClient(ctx, p.addr, func(ctx context.Context, cl *redis.Client) error {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("querying CLUSTER INFO: %w", err)
			}
			if state := infoField(info, "cluster_state"); state != "ok" {
				return fmt.Errorf("cluster_state is %q", state)
			}
			nodes, err := clusterView(ctx, cl)
			if err != nil {
				return err
			}
			owners := slotOwners(nodes)
			for slot, owner := range owners {
				if owner == "" || !c.alive(owner) {
					return fmt.Errorf("slot %d is not served by a live master", slot)
				}
			}
			if ref == nil {
				ref = owners
			} else if !slices.Equal(ref, owners) {
				return errors.New("slot map differs from other nodes'")
			}
			if !startup {
				return nil
			}

			if len(nodes) != len(c.nodes) {
				return fmt.Errorf("knows %d of %d nodes", len(nodes), len(c.nodes))
			}
			masters := 0
			for _, n := range nodes {
				if !n.usable() {
					return fmt.Errorf("sees %s with flags %s", n.addr, strings.Join(n.flags, ","))
				}
				if n.is("master") {
					masters++
				}
			}
			// Replicas start out as empty masters; until gossip says
			// otherwise, some nodes would report them among the masters.
			if masters != clusterMasters {
				return fmt.Errorf("sees %d masters, want %d", masters, clusterMasters)
			}
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("querying INFO replication: %w", err)
			}
			if infoField(repl, "role") == "slave" {
				if s := infoField(repl, "master_link_status"); s != "up" {
					return fmt.Errorf("replica link is %q", s)
				}
				replicas++
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", p.addr, err)
		}
	}
	if startup && replicas != clusterReplicas {
		return fmt.Errorf("%d of %d replicas are attached", replicas, clusterReplicas)
	}
	return nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr string
	flags    []string
	slots    [][2]int // inclusive ranges
}

func (n clusterNode) is(flag string) bool { return slices.Contains(n.flags, flag) }

// usable reports whether the node is a settled, reachable member.
func (n clusterNode) usable() bool {
	return !n.is("fail") && !n.is("fail?") && !n.is("noaddr") && !n.is("handshake")
}

func clusterView(ctx context.Context, cl *redis.Client) ([]clusterNode, error) {
	out, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("querying CLUSTER NODES: %w", err)
	}
	nodes, err := parseClusterNodes(out)
	if err != nil {
		return nil, fmt.Errorf("parsing CLUSTER NODES: %w", err)
	}
	return nodes, nil
}

// parseClusterNodes parses lines of the form
// "<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...".
func parseClusterNodes(out string) ([]clusterNode, error) {
	var nodes []clusterNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("malformed line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: addr, flags: strings.Split(f[2], ",")}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue // a slot being imported or migrated, still owned elsewhere
			}
			lo, hi, isRange := strings.Cut(s, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil || l < 0 || h >= clusterSlots || l > h {
				return nil, fmt.Errorf("malformed slot range %q", s)
			}
			n.slots = append(n.slots, [2]int{l, h})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// slotOwners maps each slot to the address of the usable master serving it,
// or "" if none does.
func slotOwners(nodes []clusterNode) []string {
	owners := make([]string, clusterSlots)
	for _, n := range nodes {
		if !n.is("master") || !n.usable() {
			continue
		}
		for _, r := range n.slots {
			for slot := r[0]; slot <= r[1]; slot++ {
				owners[slot] = n.addr
			}
		}
	}
	return owners
}
