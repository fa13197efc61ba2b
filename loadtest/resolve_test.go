package edgeguard

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// resolve follows a region's Consul DNS the way the scenarios do: the
// prepared query "edge" answers with the healthy edges, and a change shows
// within the one-second cache.
func TestResolveThroughConsulDNS(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	client, err := c.Client("")
	require.NoError(t, err)
	for i, addr := range []string{"127.0.101.1", "127.0.101.2"} {
		require.NoError(t, client.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID: "edge-" + string(rune('a'+i)), Name: "edgeguard-edge", Address: addr, Port: 8080,
		}))
	}
	_, _, err = client.PreparedQuery().Create(&api.PreparedQueryDefinition{
		Name: "edge", Service: api.ServiceQuery{Service: "edgeguard-edge", OnlyPassing: true},
	}, nil)
	require.NoError(t, err)

	v := newVU(t, New(), 1, initCode)
	require.NoError(t, v.rt.VU.Runtime().Set("DNS", c.DNSAddr()))
	lookup := func() string {
		val, err := v.rt.VU.Runtime().RunString(`eg.resolve(DNS, 'edge.query.consul').join(',')`)
		if err != nil {
			return "error: " + err.Error()
		}
		addrs := strings.Split(val.String(), ",")
		sort.Strings(addrs)
		return strings.Join(addrs, ",")
	}
	require.Eventually(t, func() bool { return lookup() == "127.0.101.1,127.0.101.2" }, 20*time.Second, 100*time.Millisecond,
		"last answer: %s", lookup())

	require.NoError(t, client.Agent().ServiceDeregister("edge-a"))
	require.Eventually(t, func() bool { return lookup() == "127.0.101.2" }, 10*time.Second, 100*time.Millisecond,
		"last answer: %s", lookup())

	_, err = v.rt.VU.Runtime().RunString(`eg.resolve(DNS, 'nothing.query.consul')`)
	require.ErrorContains(t, err, "resolving nothing.query.consul")
}
