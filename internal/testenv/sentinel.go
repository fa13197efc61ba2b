package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

const (
	sentinelCount  = 3
	sentinelQuorum = 2
	// probeKey is written to check that a promoted master accepts writes;
	// it expires by itself so it never lingers in tests' keyspace.
	probeKey = "testenv:failover-probe"
)

// SentinelOptions configures StartSentinel.
type SentinelOptions struct {
	MasterName      string        // default "mymaster"; a plain identifier
	DownAfter       time.Duration // down-after-milliseconds, default 1s
	FailoverTimeout time.Duration // failover-timeout, default 5s
}

// Sentinel is a master with one replica, monitored by three sentinels with
// quorum 2.
type Sentinel struct {
	MasterName string

	d         *deployment
	servers   []*process // data nodes, the initial master first
	sentinels []*process
}

// StartSentinel starts the deployment and returns once the replica has
// synced and every sentinel knows the master, the replica and the other
// sentinels, so a failover can start right away.
func StartSentinel(opts SentinelOptions) (*Sentinel, error) {
	if opts.MasterName == "" {
		opts.MasterName = "mymaster"
	}
	if opts.DownAfter <= 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout <= 0 {
		opts.FailoverTimeout = 5 * time.Second
	}
	serverBin, err := servers.Lookup("redis-server")
	if err != nil {
		return nil, err
	}
	sentinelBin, sentinelArgs, err := servers.Sentinel()
	if err != nil {
		return nil, err
	}
	d, err := newDeployment("sentinel")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting sentinel: %w", err)
	}
	s := &Sentinel{MasterName: opts.MasterName, d: d}
	if err := s.start(opts, serverBin, sentinelBin, sentinelArgs); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting sentinel: %w", err)
	}
	return s, nil
}

func (s *Sentinel) start(opts SentinelOptions, serverBin, sentinelBin string, sentinelArgs []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	master, err := s.d.spawn(ctx, spec{name: "master", bin: serverBin, config: func([]int) string { return "" }})
	if err != nil {
		return err
	}
	s.servers = append(s.servers, master)
	_, masterPort, _ := net.SplitHostPort(master.addr)
	replica, err := s.d.spawn(ctx, spec{
		name:   "replica",
		bin:    serverBin,
		config: func([]int) string { return "replicaof 127.0.0.1 " + masterPort },
	})
	if err != nil {
		return err
	}
	s.servers = append(s.servers, replica)
	// Sentinels learn about replicas from the master's INFO, which they
	// query on connect and then only every 10s: the replica must be attached
	// before they start.
	if err := waitReplicaLinked(ctx, replica.addr, master.addr); err != nil {
		return err
	}

	for range sentinelCount {
		p, err := s.d.spawn(ctx, spec{
			name: "sentinel",
			bin:  sentinelBin,
			args: sentinelArgs,
			// Each sentinel rewrites its own config file (the one spawn
			// writes per process) to persist what it learns.
			config: func([]int) string {
				name := opts.MasterName
				return strings.Join([]string{
					fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d", name, masterPort, sentinelQuorum),
					fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, opts.DownAfter.Milliseconds()),
					fmt.Sprintf("sentinel failover-timeout %s %d", name, opts.FailoverTimeout.Milliseconds()),
					fmt.Sprintf("sentinel parallel-syncs %s 1", name),
				}, "\n")
			},
		})
		if err != nil {
			return err
		}
		s.sentinels = append(s.sentinels, p)
	}

	// Sentinels find each other through hello messages published every 2s.
	return proc.Poll(ctx, "sentinels to discover the deployment", func(ctx context.Context) error {
		return s.checkSentinels(ctx, master.addr, []string{replica.addr})
	})
}

// SentinelAddrs returns the addresses of the three sentinels.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr
	}
	return addrs
}

// URL returns a go-redis failover URL (for redis.ParseFailoverURL) listing
// all sentinels.
func (s *Sentinel) URL() string {
	addrs := s.SentinelAddrs()
	return "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=") +
		"&master_name=" + url.QueryEscape(s.MasterName)
}

// MasterAddr returns the master address reported by a live sentinel.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var addr string
	err := s.onLiveSentinel(ctx, func(ctx context.Context, c *redis.SentinelClient) error {
		var err error
		addr, err = masterAddrByName(ctx, c, s.MasterName)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("testenv: querying master address: %w", err)
	}
	return addr, nil
}

// KillMaster SIGKILLs the current master, as a crash would, and returns the
// address of the replica the sentinels promoted once it accepts writes.
// Without a deadline on ctx it gives up after 30s.
func (s *Sentinel) KillMaster(ctx context.Context) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()

	old, err := s.MasterAddr(ctx)
	if err != nil {
		return "", err
	}
	p := s.server(old)
	if p == nil {
		return "", fmt.Errorf("testenv: killing master: %s is not part of this deployment", old)
	}
	p.kill()
	newMaster, err := s.waitNewMaster(ctx, old)
	if err != nil {
		return "", fmt.Errorf("testenv: killing master: %w", err)
	}
	return newMaster, nil
}

// Failover forces a failover with SENTINEL FAILOVER and returns the new
// master's address once it accepts writes and the old master has synced as
// its replica, so that the deployment can fail over again.
// Without a deadline on ctx it gives up after 30s.
func (s *Sentinel) Failover(ctx context.Context) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()

	old, err := s.MasterAddr(ctx)
	if err != nil {
		return "", err
	}
	err = s.onLiveSentinel(ctx, func(ctx context.Context, c *redis.SentinelClient) error {
		return c.Failover(ctx, s.MasterName).Err()
	})
	if err != nil {
		return "", fmt.Errorf("testenv: running SENTINEL FAILOVER: %w", err)
	}
	newMaster, err := s.waitNewMaster(ctx, old)
	if err != nil {
		return "", fmt.Errorf("testenv: failing over: %w", err)
	}
	if err := s.demote(ctx, old, newMaster); err != nil {
		return "", fmt.Errorf("testenv: failing over: %w", err)
	}
	return newMaster, nil
}

// Close kills the servers and sentinels and removes their files. It is
// idempotent.
func (s *Sentinel) Close() error {
	return s.d.Close()
}

func (s *Sentinel) server(addr string) *process {
	for _, p := range s.servers {
		if p.addr == addr {
			return p
		}
	}
	return nil
}

// demote makes the old master a replica of the new one and waits until it
// has synced. Sentinel would do the same, but only once a few INFO periods
// (~10 s) have confirmed the old master still claims to be one.
func (s *Sentinel) demote(ctx context.Context, old, newMaster string) error {
	host, port, _ := net.SplitHostPort(newMaster)
	err := withClient(ctx, old, func(ctx context.Context, c *redis.Client) error {
		return c.ReplicaOf(ctx, host, port).Err()
	})
	if err != nil {
		return fmt.Errorf("making %s a replica of %s: %w", old, newMaster, err)
	}
	return waitReplicaLinked(ctx, old, newMaster)
}

// waitNewMaster waits until every live sentinel names the same master other
// than old, and that master accepts writes. Sentinels switch at slightly
// different times, and clients may ask any of them.
func (s *Sentinel) waitNewMaster(ctx context.Context, old string) (string, error) {
	var newMaster string
	err := proc.Poll(ctx, "sentinels to promote a new master", func(ctx context.Context) error {
		newMaster = ""
		for _, p := range s.sentinels {
			if !p.alive() {
				continue
			}
			c := newSentinelClient(p.addr)
			addr, err := masterAddrByName(ctx, c, s.MasterName)
			c.Close()
			switch {
			case err != nil:
				return fmt.Errorf("sentinel %s: %w", p.addr, err)
			case addr == old:
				return fmt.Errorf("sentinel %s still reports %s", p.addr, old)
			case newMaster != "" && addr != newMaster:
				return fmt.Errorf("sentinels disagree: %s vs %s", newMaster, addr)
			}
			newMaster = addr
		}
		if newMaster == "" {
			return proc.Permanent(errors.New("no live sentinels"))
		}
		return withClient(ctx, newMaster, func(ctx context.Context, c *redis.Client) error {
			role, err := roleOf(ctx, c)
			if err != nil {
				return fmt.Errorf("querying ROLE on %s: %w", newMaster, err)
			}
			if role != "master" {
				return fmt.Errorf("%s has role %q", newMaster, role)
			}
			if err := c.Set(ctx, probeKey, "1", time.Second).Err(); err != nil {
				return fmt.Errorf("writing to %s: %w", newMaster, err)
			}
			return nil
		})
	})
	return newMaster, err
}

// checkSentinels returns nil if every sentinel reports master, sees each of
// replicas as healthy and knows all other sentinels.
func (s *Sentinel) checkSentinels(ctx context.Context, master string, replicas []string) error {
	for _, p := range s.sentinels {
		c := newSentinelClient(p.addr)
		err := s.checkSentinel(ctx, c, master, replicas)
		c.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", p.addr, err)
		}
	}
	return nil
}

func (s *Sentinel) checkSentinel(ctx context.Context, c *redis.SentinelClient, master string, replicas []string) error {
	addr, err := masterAddrByName(ctx, c, s.MasterName)
	if err != nil {
		return err
	}
	if addr != master {
		return fmt.Errorf("reports master %s, want %s", addr, master)
	}

	known, err := c.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return fmt.Errorf("querying SENTINEL REPLICAS: %w", err)
	}
	healthy := make(map[string]bool)
	for _, r := range known {
		if r["flags"] == "slave" && r["master-link-status"] == "ok" {
			healthy[net.JoinHostPort(r["ip"], r["port"])] = true
		}
	}
	for _, r := range replicas {
		if !healthy[r] {
			return fmt.Errorf("does not see replica %s as healthy", r)
		}
	}

	others, err := c.Sentinels(ctx, s.MasterName).Result()
	if err != nil {
		return fmt.Errorf("querying SENTINEL SENTINELS: %w", err)
	}
	if len(others) != sentinelCount-1 {
		return fmt.Errorf("knows %d of %d other sentinels", len(others), sentinelCount-1)
	}
	return nil
}

func (s *Sentinel) onLiveSentinel(ctx context.Context, fn func(context.Context, *redis.SentinelClient) error) error {
	var errs []error
	for _, p := range s.sentinels {
		if !p.alive() {
			continue
		}
		c := newSentinelClient(p.addr)
		err := fn(ctx, c)
		c.Close()
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %w", p.addr, err))
	}
	if len(errs) == 0 {
		return errors.New("no live sentinels")
	}
	return errors.Join(errs...)
}

func newSentinelClient(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(quickOptions(addr))
}

func masterAddrByName(ctx context.Context, c *redis.SentinelClient, name string) (string, error) {
	hostPort, err := c.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return "", fmt.Errorf("querying SENTINEL GET-MASTER-ADDR-BY-NAME: %w", err)
	}
	if len(hostPort) != 2 {
		return "", fmt.Errorf("unexpected SENTINEL GET-MASTER-ADDR-BY-NAME reply %q", hostPort)
	}
	if _, err := strconv.Atoi(hostPort[1]); err != nil {
		return "", fmt.Errorf("unexpected SENTINEL GET-MASTER-ADDR-BY-NAME port %q", hostPort[1])
	}
	return net.JoinHostPort(hostPort[0], hostPort[1]), nil
}
