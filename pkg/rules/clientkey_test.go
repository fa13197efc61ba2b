package rules

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientKey(t *testing.T) {
	tests := []struct {
		ip     string
		prefix int
		want   string
	}{
		{"203.0.113.7", 64, "203.0.113.7"},
		{"::ffff:203.0.113.7", 64, "203.0.113.7"},
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", 0, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6/128"},
		{"2001:db8:1:2:3:4:5:6", 129, "2001:db8:1:2::/64"},
		{"fe80::1%eth0", 64, "fe80::/64"},
	}
	for _, tc := range tests {
		t.Run(tc.ip, func(t *testing.T) {
			require.Equal(t, tc.want, ClientKey(netip.MustParseAddr(tc.ip), tc.prefix))
		})
	}
	require.Empty(t, ClientKey(netip.Addr{}, 64))
}
