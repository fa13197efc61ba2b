package trust

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientAddr(t *testing.T) {
	trusted := Set{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	a := netip.MustParseAddr
	cases := []struct {
		name string
		peer string
		xff  []string
		want string
	}{
		{"no header", "198.51.100.7", nil, "198.51.100.7"},
		{"untrusted peer: header ignored", "198.51.100.7", []string{"1.2.3.4"}, "198.51.100.7"},
		{"trusted peer: client is the hop it saw", "10.0.0.1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"right-most untrusted hop wins over a spoofed left part", "10.0.0.1", []string{"6.6.6.6, 203.0.113.9, 10.1.1.1"}, "203.0.113.9"},
		{"several header lines read as one list", "10.0.0.1", []string{"6.6.6.6", "203.0.113.9, 10.2.2.2"}, "203.0.113.9"},
		{"garbage stops at the trusted hop", "10.0.0.1", []string{"203.0.113.9, bogus, 10.3.3.3"}, "10.3.3.3"},
		{"garbage right after the peer", "10.0.0.1", []string{"not-an-ip"}, "10.0.0.1"},
		{"all trusted: the left-most", "10.0.0.1", []string{"10.9.9.9, 10.8.8.8"}, "10.9.9.9"},
		{"mapped v4 unmapped", "10.0.0.1", []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"ipv6 hops", "2001:db8:ffff::1", []string{"2001:db8:1::5"}, "2001:db8:1::5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var xff [][]byte
			for _, h := range c.xff {
				xff = append(xff, []byte(h))
			}
			require.Equal(t, a(c.want), Client(a(c.peer), xff, trusted))
		})
	}
}
