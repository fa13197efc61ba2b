package edge

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/require"
)

// PROXY headers as a balancer may send them (haproxy.org's
// proxy-protocol.txt), over real sockets from the balancer 127.0.0.2.

// A header that arrives in pieces is read whole: the specification
// recommends receivers be tolerant of partial headers.
func TestProxyHeaderInPieces(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n", "--proxy-protocol-from", "127.0.0.2/32")
	edgePort := r.front.Ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		version byte
		at      []int
	}{
		{1, []int{3, 16, 30, -1}}, // in the signature, an address, a port, before LF
		{2, []int{8, 14, 20, -1}}, // in the signature, the length, the addresses
	} {
		for i, at := range tc.at {
			client := fmt.Sprintf("203.0.113.%d", 10*int(tc.version)+i)
			h, err := proxyproto.HeaderProxyFromAddrs(tc.version, &net.TCPAddr{IP: net.ParseIP(client), Port: 40000},
				&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: edgePort}).Format()
			require.NoError(t, err)
			if at < 0 {
				at += len(h)
			}
			t.Run(fmt.Sprintf("v%d split at %d of %d", tc.version, at, len(h)), func(t *testing.T) {
				c := dialFrom(t, "127.0.0.2", r.Addr())
				_, err := c.Write(h[:at])
				require.NoError(t, err)
				// The edge has a chance to read the first piece alone: a
				// whole exchange through another connection of the balancer.
				o := dialFrom(t, "127.0.0.2", r.Addr())
				proxyHeader(t, o, 2, "198.51.100.1")
				resp, _ := o.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				require.Equal(t, 200, resp.StatusCode)
				_, err = c.Write(h[at:])
				require.NoError(t, err)
				resp, body := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				require.Equal(t, 200, resp.StatusCode, "the header read whole")
				require.Equal(t, client, echoed(t, body)["xff"], "the client the header names")
			})
		}
	}
}

// A header without an IP client (LOCAL, v1 UNKNOWN, v2 AF_UNSPEC, v2
// AF_UNIX) is the balancer's own connection: its address is the client,
// for the rules and for --max-conns-per-ip, not 0.0.0.0 shared by all of
// them and counted by nobody.
func TestProxyHeaderWithoutAnIPClient(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n", "--proxy-protocol-from", "127.0.0.2/32", "--max-conns-per-ip", "4")
	unix, err := proxyproto.HeaderProxyFromAddrs(2, &net.UnixAddr{Net: "unix", Name: "/run/lb/client.sock"},
		&net.UnixAddr{Net: "unix", Name: "/run/lb/edge.sock"}).Format()
	require.NoError(t, err)
	local, err := proxyproto.HeaderProxyFromAddrs(2, nil, nil).Format()
	require.NoError(t, err)
	require.Equal(t, byte(0x20), local[12], "LOCAL")
	unspec := append(append([]byte{}, proxyproto.SIGV2...), 0x21, 0x00, 0x00, 0x00) // PROXY, AF_UNSPEC
	for _, h := range []struct {
		name   string
		header []byte
	}{
		{"v2 AF_UNIX", unix},
		{"v2 AF_UNSPEC", unspec},
		{"v2 LOCAL", local},
		{"v1 UNKNOWN", []byte("PROXY UNKNOWN\r\n")},
	} {
		c := dialFrom(t, "127.0.0.2", r.Addr())
		_, err := c.Write(h.header)
		require.NoError(t, err)
		resp, body := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode, h.name)
		require.Equal(t, "127.0.0.2", echoed(t, body)["xff"], "%s: the balancer is the client", h.name)
	}
	// Four held open: the balancer's address has its share.
	c := dialFrom(t, "127.0.0.2", r.Addr())
	_, err = c.Write(unix)
	require.NoError(t, err)
	resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 429, resp.StatusCode, "AF_UNIX clients are capped as the balancer's address")

	c = dialFrom(t, "127.0.0.2", r.Addr())
	proxyHeader(t, c, 2, "203.0.113.20")
	resp, _ = c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode, "a client with an address has its own share")
}

// A v2 header's TLVs must fit in it: one whose length runs past the header
// is refused (the connection closed, counted as invalid_header); well-formed
// ones, whatever their type, are accepted.
func TestProxyHeaderTLVs(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n", "--proxy-protocol-from", "127.0.0.2/32")
	v2 := func(tlvs ...byte) []byte {
		h := append([]byte{}, proxyproto.SIGV2...)
		h = append(h, 0x21, 0x11) // PROXY, TCP over IPv4
		h = binary.BigEndian.AppendUint16(h, uint16(12+len(tlvs)))
		h = append(h, 203, 0, 113, 40, 127, 0, 0, 1)
		h = binary.BigEndian.AppendUint16(h, 40000)
		h = binary.BigEndian.AppendUint16(h, 80)
		return append(h, tlvs...)
	}
	for _, tc := range []struct {
		name   string
		header []byte
		ok     bool
	}{
		{"an authority TLV", v2(append([]byte{0x02, 0x00, 0x01}, 'a')...), true},
		{"padding and an unknown type", v2(0x04, 0x00, 0x02, 0, 0, 0xE0, 0x00, 0x00), true},
		{"a TLV whose length runs past the header", v2(0x02, 0x00, 0x10, 'a', 'b'), false},
		{"a TLV cut in its length", v2(0x02, 0x00), false},
		{"a second TLV running past the header", v2(0x04, 0x00, 0x00, 0x02, 0x01, 0x00), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricSum(t, r, "edgeguard_edge_proxy_protocol_refused_total", "reason", "invalid_header")
			c := dialFrom(t, "127.0.0.2", r.Addr())
			_, err := c.Write(tc.header)
			require.NoError(t, err)
			if tc.ok {
				resp, body := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				require.Equal(t, 200, resp.StatusCode)
				require.Equal(t, "203.0.113.40", echoed(t, body)["xff"])
				return
			}
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			_, err = http.ReadResponse(c.r, nil)
			require.Error(t, err, "closed without an answer")
			require.Equal(t, before+1, metricSum(t, r, "edgeguard_edge_proxy_protocol_refused_total", "reason", "invalid_header"))
		})
	}
}
