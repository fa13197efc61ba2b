package listen

import (
	"net/netip"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestH2Budget(t *testing.T) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	b := newH2Budget(80, g)
	a, c := b.client(netip.MustParseAddr("192.0.2.1"), true), b.client(netip.MustParseAddr("192.0.2.2"), true)
	require.Same(t, a, b.client(netip.MustParseAddr("192.0.2.1"), true), "one record per address")
	trusted := b.client(netip.Addr{}, false)

	require.True(t, b.take(a, 50), "a client holding nothing takes one response the edge has room for")
	require.False(t, b.room(a), "then it is over its share (10)")
	require.False(t, b.take(a, 1))
	require.True(t, b.room(c))
	require.False(t, b.take(c, 31), "beyond the edge's bound")
	require.True(t, b.take(c, 5))
	require.True(t, b.take(c, 5), "within its share")
	require.False(t, b.take(c, 1), "beyond its share")
	require.True(t, b.take(trusted, 20), "a trusted connection is a client of its own")
	require.False(t, b.room(trusted))
	require.False(t, b.room(netipClient(b, "192.0.2.3")), "the edge holds its bound")
	require.Equal(t, 80.0, gaugeValue(t, g))

	for _, x := range []struct {
		c *heldClient
		n int64
	}{{a, 50}, {c, 5}, {c, 5}, {trusted, 20}} {
		b.release(x.c, x.n)
	}
	require.Zero(t, gaugeValue(t, g))
	require.Equal(t, int64(80), b.peak)
	b.leave(a)
	require.Len(t, b.clients, 3, "192.0.2.1 still has a connection")
	b.leave(a)
	b.leave(c)
	require.Len(t, b.clients, 1, "idle records are dropped")
}

func netipClient(b *h2Budget, addr string) *heldClient {
	return b.client(netip.MustParseAddr(addr), true)
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}
