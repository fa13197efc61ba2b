package edge

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// Nothing a client sends holds the accept path. With --max-conns-per-ip 4
// and ten times that many idle connections over the cap from one address,
// another address is served while they are all still open, on the plain
// and the TLS listener, with and without --proxy-protocol-from (the idle
// connections straight from the client, or through the balancer naming
// it, with header-less balancer connections waiting besides). The read
// (and PROXY header) timeout is 30 s and every exchange of the test has
// 10 s: the other client is served without anything waiting for the
// idle connections' bytes. The connections over the cap are refused at
// once (429 and closed on the plain listener, closed under TLS), not when
// the timeout ends.
func TestAcceptNeverWaitsOnAClient(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	const (
		perClient = 4
		overCap   = 10 * perClient
		balancer  = "127.0.0.3"
		other     = "127.0.0.2"
	)
	n := 0
	for _, proxied := range []bool{false, true} {
		r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) {
			c.MaxConnsPerIP = perClient
			c.ReadTimeout, c.IdleTimeout = 30*time.Second, 30*time.Second
			if proxied {
				c.ProxyProtocolFrom = []netip.Prefix{mustPrefix(balancer + "/32")}
			}
		})
		for _, secure := range []bool{false, true} {
			addr := r.Addr()
			if secure {
				addr = r.TLSAddr()
			}
			through := []bool{false}
			if proxied {
				through = append(through, true)
			}
			for _, viaBalancer := range through {
				n++
				// One hog address (or client named by the balancer) a case.
				hog, named := fmt.Sprintf("127.0.1.%d", n), fmt.Sprintf("203.0.113.%d", n)
				name := fmt.Sprintf("proxy protocol %v, TLS %v, through the balancer %v", proxied, secure, viaBalancer)
				t.Run(name, func(t *testing.T) {
					deadline := time.Now().Add(10 * time.Second)
					// open connects as the hog does, its header sent.
					open := func() *rawConn {
						if !viaBalancer {
							return dialFrom(t, hog, addr)
						}
						c := dialFrom(t, balancer, addr)
						proxyHeader(t, c, 2, named)
						return c
					}
					for range perClient {
						c := open()
						require.NoError(t, c.SetDeadline(deadline))
						require.Equal(t, 200, exchange(t, c, secure), "within the cap")
					}
					var extra []*rawConn
					for range overCap {
						extra = append(extra, open())
					}
					if viaBalancer {
						for range overCap {
							dialFrom(t, balancer, addr) // no header yet
						}
					}

					c := dialFrom(t, other, addr)
					require.NoError(t, c.SetDeadline(deadline))
					require.Equal(t, 200, exchange(t, c, secure), "another address is served while the idle connections are open")
					_ = c.Close()
					if proxied {
						c := dialFrom(t, balancer, addr)
						require.NoError(t, c.SetDeadline(deadline))
						proxyHeader(t, c, 1, "198.51.100.7")
						require.Equal(t, 200, exchange(t, c, secure), "another client through the balancer too")
						_ = c.Close()
					}

					for _, c := range extra {
						require.NoError(t, c.SetDeadline(deadline))
						if !secure {
							resp, err := http.ReadResponse(c.r, nil)
							require.NoError(t, err, "a refusal, not a wait")
							require.Equal(t, 429, resp.StatusCode)
							continue
						}
						_, err := c.r.ReadByte()
						var ne net.Error
						require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed at once, not left waiting: %v", err)
						require.Error(t, err)
					}
				})
			}
		}
	}
}

// exchange sends one request on c (over TLS when secure) and returns the
// response's status.
func exchange(t *testing.T, c *rawConn, secure bool) int {
	t.Helper()
	var rw io.ReadWriter = c
	br := c.r
	if secure {
		tc := tls.Client(c.Conn, &tls.Config{ServerName: "shop.example.com", InsecureSkipVerify: true}) //nolint:gosec // the test's own edge
		rw, br = tc, bufio.NewReader(tc)
	}
	_, err := io.WriteString(rw, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}
