package listen

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// Without a TLS listener (a nil *TLS) there is no address, no
// certificates and no HTTP/2 server; with one, each is its own.
func TestTLSAccessors(t *testing.T) {
	var none *TLS
	require.Empty(t, none.Addr())
	require.Nil(t, none.Certificates())
	require.Nil(t, none.HTTP2())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	certs, h2 := &Certs{}, &H2Server{}
	tl := &TLS{Ln: ln, Certs: certs, H2: h2}
	require.Equal(t, ln.Addr().String(), tl.Addr())
	require.Same(t, certs, tl.Certificates())
	require.Same(t, h2, tl.HTTP2())
}
