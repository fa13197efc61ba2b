// Package servers finds the server programs edgeguard runs beside itself —
// redis-server, redis-sentinel, the Consul agent, Prometheus and the Redis
// exporter — and writes the Redis settings every one of its Redis processes
// shares. The test harness (internal/testenv) and the local stack
// (internal/stack) both start servers through it, so neither depends on the
// other.
package servers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// ConsulVersion is the Consul release scripts/install-consul.sh builds and
// caches when the machine has no consul of its own.
const ConsulVersion = "1.21.0"

const hint = `run "make tools", which installs or builds and caches it`

// Lookup resolves a program in PATH, with an error that says how to
// install it.
func Lookup(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found in PATH (%s): %w", name, hint, err)
	}
	return path, nil
}

// Consul finds the agent: $EDGEGUARD_CONSUL, else consul in PATH, else the
// binary scripts/install-consul.sh caches.
func Consul() (string, error) {
	if p := os.Getenv("EDGEGUARD_CONSUL"); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("EDGEGUARD_CONSUL=%s is not an executable (%s): %w", p, hint, err)
		}
		return path, nil
	}
	if path, err := exec.LookPath("consul"); err == nil {
		return path, nil
	}
	cached, err := ConsulCachePath()
	if err != nil {
		return "", fmt.Errorf("consul not found: EDGEGUARD_CONSUL is unset, no consul in PATH, and %w (%s)", err, hint)
	}
	if _, err := exec.LookPath(cached); err != nil {
		return "", fmt.Errorf("consul not found: EDGEGUARD_CONSUL is unset, no consul in PATH, no %s (%s)", cached, hint)
	}
	return cached, nil
}

// ConsulCachePath is where scripts/install-consul.sh caches the agent:
// $EDGEGUARD_CACHE, else ~/.cache/edgeguard, then consul-<version>/consul.
func ConsulCachePath() (string, error) {
	cache := os.Getenv("EDGEGUARD_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("locating the cache: %w", err)
		}
		cache = filepath.Join(home, ".cache", "edgeguard")
	}
	return filepath.Join(cache, "consul-"+ConsulVersion, "consul"), nil
}

// Sentinel returns the program and leading arguments that run a sentinel;
// some distributions ship only redis-server, which has a sentinel mode of
// its own.
func Sentinel() (bin string, args []string, err error) {
	if bin, err := exec.LookPath("redis-sentinel"); err == nil {
		return bin, nil, nil
	}
	bin, err = Lookup("redis-server")
	if err != nil {
		return "", nil, err
	}
	return bin, []string{"--sentinel"}, nil
}

// RedisBaseConfig is the redis.conf every Redis process edgeguard starts
// shares: loopback only, no persistence, fast shutdown and replication.
func RedisBaseConfig(port int, dir, logPath string) string {
	return strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + Quote(dir),
		"logfile " + Quote(logPath),
		`save ""`,
		"appendonly no",
		// Masters otherwise wait up to 10 s for lagging replicas on SIGTERM.
		"shutdown-on-sigterm now",
		// The default 5 s delay, meant to batch replicas into one transfer,
		// would dominate startup and rejoin times.
		"repl-diskless-sync-delay 0",
	}, "\n") + "\n"
}

// Quote quotes s for a redis.conf or Consul HCL string.
func Quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
