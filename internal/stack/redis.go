package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

// redisDeployment is a region's Redis as processes in dir.
type redisDeployment struct {
	spec RedisSpec
	dir  string
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// nodeProc is the redis-server on port.
func (r redisDeployment) nodeProc(bin string, port int) proc.Daemon {
	name := fmt.Sprintf("node-%d", port)
	return proc.Daemon{Name: name, Dir: r.dir, Bin: bin, Args: []string{filepath.Join(r.dir, name+".conf")}}
}

func (r redisDeployment) sentinelProc(bin string, args []string, port int) proc.Daemon {
	name := fmt.Sprintf("sentinel-%d", port)
	return proc.Daemon{Name: name, Dir: r.dir, Bin: bin, Args: append([]string{filepath.Join(r.dir, name+".conf")}, args...)}
}

func (r redisDeployment) exporterProc(bin string, i int) proc.Daemon {
	return proc.Daemon{Name: fmt.Sprintf("exporter-%d", r.spec.ExporterPorts[i]), Dir: r.dir, Bin: bin, Args: []string{
		"-redis.addr=redis://" + addr(r.spec.Ports[i]),
		"-web.listen-address=" + addr(r.spec.ExporterPorts[i]),
	}}
}

// writeConf writes a config once: Redis rewrites its own (nodes.conf,
// sentinel state), which a restart must keep.
func writeConf(path, content string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// ensureRedis starts what is missing of the region's Redis and its exporters
// and returns once the deployment is healthy again (every node up, slots or
// master served, replicas linked).
func ensureRedis(ctx context.Context, r redisDeployment) error {
	server, err := servers.Lookup("redis-server")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	switch r.spec.Mode {
	case "cluster":
		err = ensureCluster(ctx, r, server)
	case "sentinel":
		err = ensureSentinel(ctx, r, server)
	default:
		err = fmt.Errorf("unknown redis mode %q", r.spec.Mode)
	}
	if err != nil {
		return fmt.Errorf("redis of %s: %w", r.spec.Region, err)
	}
	return ensureExporters(ctx, r)
}

func ensureExporters(ctx context.Context, r redisDeployment) error {
	bin, err := exec.LookPath("prometheus-redis-exporter")
	if err != nil {
		return fmt.Errorf("prometheus-redis-exporter not found in PATH (run \"make tools\"): %w", err)
	}
	for i := range r.spec.Ports {
		p := r.exporterProc(bin, i)
		if _, err := p.Ensure(); err != nil {
			return err
		}
		err := p.WaitAlive(ctx, "redis exporter on "+addr(r.spec.ExporterPorts[i]), func(ctx context.Context) error {
			return httpOK(ctx, "http://"+addr(r.spec.ExporterPorts[i])+"/metrics")
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// startNodes starts each dead node (with its own config, written on first
// start) and waits until all answer PING.
func startNodes(ctx context.Context, r redisDeployment, bin string, extra func(port int) string) error {
	var procs []proc.Daemon
	for _, port := range r.spec.Ports {
		p := r.nodeProc(bin, port)
		conf := servers.RedisBaseConfig(port, r.dir, p.LogPath()+".redis") + extra(port) + "\n"
		if err := writeConf(p.Args[0], conf); err != nil {
			return err
		}
		if _, err := p.Ensure(); err != nil {
			return err
		}
		procs = append(procs, p)
	}
	for i, p := range procs {
		a := addr(r.spec.Ports[i])
		if err := p.WaitAlive(ctx, "redis "+a, func(ctx context.Context) error { return ping(ctx, a) }); err != nil {
			return err
		}
	}
	return nil
}

func client(a string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: a, DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second,
		MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true, DisableIdentity: true})
}

func ping(ctx context.Context, a string) error {
	c := client(a)
	defer c.Close()
	return c.Ping(ctx).Err()
}

func info(ctx context.Context, a, section string) (string, error) {
	c := client(a)
	defer c.Close()
	return c.Info(ctx, section).Result()
}

func infoField(info, key string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

func ensureCluster(ctx context.Context, r redisDeployment, bin string) error {
	err := startNodes(ctx, r, bin, func(port int) string {
		return strings.Join([]string{
			"cluster-enabled yes",
			"cluster-port " + strconv.Itoa(port+10000),
			fmt.Sprintf("cluster-config-file nodes-%d.conf", port),
			"cluster-node-timeout 1000",
			"cluster-replica-validity-factor 0",
		}, "\n")
	})
	if err != nil {
		return err
	}
	created := filepath.Join(r.dir, "cluster-created")
	if _, err := os.Stat(created); err != nil {
		cli, err := servers.Lookup("redis-cli")
		if err != nil {
			return err
		}
		args := []string{"--cluster", "create"}
		for _, p := range r.spec.Ports {
			args = append(args, addr(p))
		}
		args = append(args, "--cluster-replicas", "1", "--cluster-yes")
		if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("running redis-cli --cluster create: %w\n%s", err, out)
		}
		if err := os.WriteFile(created, nil, 0o644); err != nil {
			return err
		}
	}
	return proc.Poll(ctx, "cluster of "+r.spec.Region+" to be healthy", func(ctx context.Context) error {
		return clusterHealthy(ctx, r.spec.Ports)
	})
}

// clusterHealthy: every node reports cluster_state:ok, knows all nodes,
// sees none failed, and 3 masters each have a linked replica.
func clusterHealthy(ctx context.Context, ports []int) error {
	replicas := 0
	for _, port := range ports {
		a := addr(port)
		c := client(a)
		ci, err := c.ClusterInfo(ctx).Result()
		var nodes string
		if err == nil {
			nodes, err = c.ClusterNodes(ctx).Result()
		}
		var repl string
		if err == nil {
			repl, err = c.Info(ctx, "replication").Result()
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		if s := infoField(ci, "cluster_state"); s != "ok" {
			return fmt.Errorf("%s: cluster_state %s", a, s)
		}
		if n := infoField(ci, "cluster_known_nodes"); n != strconv.Itoa(len(ports)) {
			return fmt.Errorf("%s knows %s nodes", a, n)
		}
		if strings.Contains(nodes, "fail") || strings.Contains(nodes, "handshake") {
			return fmt.Errorf("%s sees failed nodes", a)
		}
		if infoField(repl, "role") == "slave" {
			if infoField(repl, "master_link_status") != "up" {
				return fmt.Errorf("%s: replica link down", a)
			}
			replicas++
		}
	}
	if replicas != len(ports)/2 {
		return fmt.Errorf("%d of %d replicas linked", replicas, len(ports)/2)
	}
	return nil
}

func ensureSentinel(ctx context.Context, r redisDeployment, bin string) error {
	master := r.spec.Ports[0]
	err := startNodes(ctx, r, bin, func(port int) string {
		if port == master {
			return ""
		}
		return "replicaof 127.0.0.1 " + strconv.Itoa(master)
	})
	if err != nil {
		return err
	}
	sbin, sargs, err := servers.Sentinel()
	if err != nil {
		return err
	}
	// The first start waits for the replica so the sentinels learn it from
	// the master's INFO right away.
	if err := proc.Poll(ctx, "replica to link", func(ctx context.Context) error { return sentinelDataHealthy(ctx, r.spec.Ports) }); err != nil {
		return err
	}
	name := r.spec.MasterName
	for _, port := range r.spec.SentinelPorts {
		p := r.sentinelProc(sbin, sargs, port)
		conf := servers.RedisBaseConfig(port, r.dir, p.LogPath()+".redis") + strings.Join([]string{
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", name, master),
			fmt.Sprintf("sentinel down-after-milliseconds %s 1000", name),
			fmt.Sprintf("sentinel failover-timeout %s 5000", name),
			fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		}, "\n") + "\n"
		if err := writeConf(p.Args[0], conf); err != nil {
			return err
		}
		if _, err := p.Ensure(); err != nil {
			return err
		}
		if err := p.WaitAlive(ctx, "sentinel "+addr(port), func(ctx context.Context) error { return ping(ctx, addr(port)) }); err != nil {
			return err
		}
	}
	return proc.Poll(ctx, "sentinel group of "+r.spec.Region+" to be healthy", func(ctx context.Context) error {
		if err := sentinelDataHealthy(ctx, r.spec.Ports); err != nil {
			return err
		}
		for _, port := range r.spec.SentinelPorts {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr(port), DialTimeout: 500 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
			m, err := sc.GetMasterAddrByName(ctx, name).Result()
			var sentinels []map[string]string
			if err == nil {
				sentinels, err = sc.Sentinels(ctx, name).Result()
			}
			sc.Close()
			if err != nil {
				return fmt.Errorf("sentinel %d: %w", port, err)
			}
			if len(m) != 2 {
				return fmt.Errorf("sentinel %d: no master", port)
			}
			role, err := info(ctx, net.JoinHostPort(m[0], m[1]), "replication")
			if err != nil || infoField(role, "role") != "master" {
				return fmt.Errorf("sentinel %d names %v, not a master", port, m)
			}
			if len(sentinels) != len(r.spec.SentinelPorts)-1 {
				return fmt.Errorf("sentinel %d knows %d others", port, len(sentinels))
			}
		}
		return nil
	})
}

// sentinelDataHealthy: exactly one master and every other node a replica
// with its link up.
func sentinelDataHealthy(ctx context.Context, ports []int) error {
	masters := 0
	for _, port := range ports {
		repl, err := info(ctx, addr(port), "replication")
		if err != nil {
			return fmt.Errorf("%s: %w", addr(port), err)
		}
		switch infoField(repl, "role") {
		case "master":
			masters++
		case "slave":
			if infoField(repl, "master_link_status") != "up" {
				return fmt.Errorf("%s: replica link down", addr(port))
			}
		}
	}
	if masters != 1 {
		return errors.New("not exactly one master")
	}
	return nil
}
