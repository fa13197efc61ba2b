// Package testenv starts real Redis deployments — standalone, cluster and
// sentinel — on loopback for integration tests.
//
// Every deployment gets its own temporary directory and freshly picked
// 127.0.0.1 ports, so packages whose tests run in parallel never collide.
// Child processes are bound to the test binary (on Linux via Pdeathsig), so
// they die with it even if it panics or is killed.
//
// Cluster and sentinel deployments take a few seconds to converge, so start
// one per package in TestMain and share it:
//
//	var cluster *testenv.Cluster
//
//	func TestMain(m *testing.M) {
//		c, err := testenv.StartCluster(testenv.ClusterOptions{})
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer c.Close()
//		cluster = c
//		m.Run() // since Go 1.15 the wrapper exits with m.Run's code
//	}
//
// Tests sharing a deployment must namespace their keys with KeyPrefix, so
// they can run with t.Parallel and -count>1 without seeing each other's data:
//
//	key := testenv.KeyPrefix(t) + "bucket"
//
// Tests that kill nodes or trigger failovers change the topology under every
// other test, so give each of them its own deployment and close it with
// t.Cleanup.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// startTimeout bounds each Start* call and every wait whose ctx has no
// deadline; a healthy deployment converges in a few seconds, so hitting it
// means something is broken rather than slow.
const startTimeout = 30 * time.Second

// KeyPrefix returns a key prefix unique to tb, ending in ":", for tests that
// share a deployment. It is at most 64 bytes, contains only [A-Za-z0-9_.-]
// before the separator, and never contains a hash tag, so keys built from it
// still spread over all cluster slots.
func KeyPrefix(tb testing.TB) string {
	const suffixLen = 1 + 8 + 1 // "-", 8 hex digits, ":"
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			return r
		}
		return '_'
	}, tb.Name())
	if len(name) > 64-suffixLen {
		name = name[:64-suffixLen]
	}
	// The random part keeps -count>1 runs and leftovers of crashed runs apart.
	return fmt.Sprintf("%s-%08x:", name, rand.Uint32())
}

// withDefaultTimeout caps waits whose caller gave no deadline, so a
// deployment that never converges fails the test instead of hanging it.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, startTimeout)
}

// newClient returns a client for one-off queries by the harness itself. It
// never retries and honours ctx deadlines, so a dead node costs one short
// timeout per poll instead of stalling the wait.
func newClient(addr string) *redis.Client { return redis.NewClient(quickOptions(addr)) }

// quickOptions are the harness clients' options (data nodes and sentinels).
func quickOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		DialTimeout:           500 * time.Millisecond,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		PoolSize:              1,
		DisableIdentity:       true,
	}
}

// withClient runs fn with a short-lived client for addr.
func withClient(ctx context.Context, addr string, fn func(context.Context, *redis.Client) error) error {
	c := newClient(addr)
	defer c.Close()
	return fn(ctx, c)
}

// infoField extracts one "key:value" line from an INFO reply.
func infoField(info, key string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// waitReplicaLinked waits until the server at addr replicates from master
// and has finished its initial sync, so data written before a failover
// survives it.
func waitReplicaLinked(ctx context.Context, addr, master string) error {
	_, masterPort, _ := net.SplitHostPort(master)
	return proc.Poll(ctx, "replica "+addr+" to sync with "+master, func(ctx context.Context) error {
		return withClient(ctx, addr, func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("querying INFO replication on %s: %w", addr, err)
			}
			if role := infoField(info, "role"); role != "slave" {
				return fmt.Errorf("%s has role %q", addr, role)
			}
			if p := infoField(info, "master_port"); p != masterPort {
				return fmt.Errorf("%s replicates from port %s, want %s", addr, p, masterPort)
			}
			if s := infoField(info, "master_link_status"); s != "up" {
				return fmt.Errorf("%s has master_link_status %q", addr, s)
			}
			return nil
		})
	})
}

// roleOf returns the first element of ROLE ("master", "slave", "sentinel").
func roleOf(ctx context.Context, c *redis.Client) (string, error) {
	reply, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "", err
	}
	if len(reply) == 0 {
		return "", errors.New("empty ROLE reply")
	}
	role, _ := reply[0].(string)
	return role, nil
}

// EarlyInWindow returns once at least need is left of the current
// epoch-aligned window of length w (fixed_window's windows), sleeping
// until the next window starts if less is. A test whose steps must fall
// in one window calls it first: the window's end is a wall-clock
// boundary, not an event to wait for.
func EarlyInWindow(w, need time.Duration) {
	now := time.Now()
	if end := now.Truncate(w).Add(w); end.Sub(now) < need {
		time.Sleep(end.Sub(now))
	}
}

// Within returns a context that ends after d or with tb, whichever comes
// first: the bound of a wait (proc.Poll) inside a test.
func Within(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(tb.Context(), d)
	tb.Cleanup(cancel)
	return ctx
}
