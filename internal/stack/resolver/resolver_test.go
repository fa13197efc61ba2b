package resolver

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A prepared query over a real Consul agent answers only the instances
// whose check passes, and the answers follow a check going critical.
func TestLookupFollowsHealth(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	cl, err := c.Client("")
	require.NoError(t, err)

	for _, a := range []string{"127.0.1.1", "127.0.1.2"} {
		require.NoError(t, cl.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID: "edge-" + a, Name: "edgeguard-edge", Address: a, Port: 8080,
			Check: &api.AgentServiceCheck{CheckID: "ttl-" + a, TTL: "1m"},
		}))
		require.NoError(t, cl.Agent().UpdateTTL("ttl-"+a, "", api.HealthPassing))
	}
	_, _, err = cl.PreparedQuery().Create(&api.PreparedQueryDefinition{
		Name:    "edge",
		Service: api.ServiceQuery{Service: "edgeguard-edge", OnlyPassing: true},
		DNS:     api.QueryDNSOptions{TTL: "0s"},
	}, nil)
	require.NoError(t, err)

	r, err := New(c.DNSAddr())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	both := []netip.Addr{netip.MustParseAddr("127.0.1.1"), netip.MustParseAddr("127.0.1.2")}
	require.Eventually(t, func() bool {
		got, err := r.Lookup(ctx, "edge")
		return err == nil && slices.Equal(got, both)
	}, 10*time.Second, 50*time.Millisecond)

	require.NoError(t, cl.Agent().UpdateTTL("ttl-127.0.1.1", "draining", api.HealthCritical))
	got, err := r.Lookup(ctx, "edge")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("127.0.1.2")}, got)

	require.NoError(t, cl.Agent().UpdateTTL("ttl-127.0.1.2", "draining", api.HealthCritical))
	_, err = r.Lookup(ctx, "edge")
	require.Error(t, err, "no healthy edge: no answer")
}

func TestNewRejectsBadAddress(t *testing.T) {
	_, err := New("127.0.0.1")
	require.Error(t, err)
}
