package limiter_test

import (
	"context"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// clusterHome is the shared Redis Cluster. Dialing through a faults.Net,
// the client keeps the nodes' own addresses (CLUSTER SLOTS, MOVED) and
// reaches each node through its proxy: every node sits behind the link,
// with no proxy address announced by the Cluster.
func clusterHome(t testing.TB, dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterSrv().Addrs(), Dialer: dial, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestGlobalClusterHomePartitionAndHeal is TestGlobalPartitionAndHeal
// with a Redis Cluster as the home region's Redis: the away region's edges
// lease from every node over the link, are cut off from all of them
// (black hole, then closed), decide from the static share within
// L·(1+t) + share, and once healed settle each debt once.
func TestGlobalClusterHomePartitionAndHeal(t *testing.T) { partitionAndHeal(t, clusterHome) }
