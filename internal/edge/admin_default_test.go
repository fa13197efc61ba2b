package edge

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// The default admin address is private and clear of the ports the
// monitoring next to an edge listens on, so an edge and a Prometheus (or an
// exporter) on one host both start with their defaults.
func TestDefaultAdminClashesWithNothing(t *testing.T) {
	ap, err := netip.ParseAddrPort(config.DefaultConfig().Admin)
	require.NoError(t, err)
	require.True(t, ap.Addr().IsLoopback(), "the admin port is private by default")
	taken := map[uint16]string{
		9090: "Prometheus", 9091: "Pushgateway", 9093: "Alertmanager", 9094: "Alertmanager cluster",
		9100: "node exporter", 9121: "redis exporter", 3000: "Grafana", 8500: "Consul HTTP", 8600: "Consul DNS",
		6379: "Redis", 26379: "Redis Sentinel", 4317: "OTLP gRPC", 4318: "OTLP HTTP", 8080: "the public listener",
	}
	require.NotContains(t, taken, ap.Port(), "default admin port %d is %s's", ap.Port(), taken[ap.Port()])
}
