package edge

import (
	"bufio"
	"crypto/tls"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// With --tls-check-host, a TLS request whose Host the connection's
// certificate does not cover gets 421 (counted as misdirected), over
// HTTP/1.1 and on an HTTP/2 connection, while HTTP/2 connection reuse for
// another name the certificate covers keeps working. Off, any Host goes.
func TestTLSCheckHost(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com", "*.shop.example.com", "img.example.net")
	site.put(t, "other.pem", "ecdsa", "other.example.org")
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			r, _ := startTLSEdge(t, site, generous, func(c *config.Config) { c.TLSCheckHost = on })
			misdirected := http.StatusOK
			if on {
				misdirected = http.StatusMisdirectedRequest
			}

			c, err := site.dialTLS(r, "shop.example.com", nil)
			require.NoError(t, err)
			defer c.Close()
			br := bufio.NewReader(c)
			for host, want := range map[string]int{
				"shop.example.com":      http.StatusOK,
				"SHOP.example.com.:443": http.StatusOK, // as the rules normalise it
				"a.shop.example.com":    http.StatusOK, // the wildcard SAN
				"img.example.net":       http.StatusOK,
				"a.b.shop.example.com":  misdirected, // a wildcard covers one label
				"other.example.org":     misdirected, // served by another certificate
				"unknown.example.com":   misdirected,
				"127.0.0.1":             misdirected,
			} {
				resp, body := tlsGet(t, c, br, host, "/")
				require.Equal(t, want, resp.StatusCode, "Host %s: %s", host, body)
				if want == http.StatusMisdirectedRequest {
					require.Contains(t, string(body), "does not cover the request's Host")
				}
			}

			// HTTP/2: streams for names the certificate covers share the
			// connection (coalescing); another name's stream gets 421 and
			// the connection goes on.
			hc, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.NextProtos = []string{"h2"} })
			require.NoError(t, err)
			defer hc.Close()
			require.Equal(t, "h2", hc.ConnectionState().NegotiatedProtocol)
			_, err = hc.Write([]byte(http2.ClientPreface))
			require.NoError(t, err)
			h := &rawH2{c: hc, fr: http2.NewFramer(hc, hc)}
			h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			h.enc = hpack.NewEncoder(&h.buf)
			require.NoError(t, h.fr.WriteSettings())
			for i, tc := range []struct {
				authority string
				want      int
			}{
				{"shop.example.com", http.StatusOK},
				{"img.example.net", http.StatusOK},
				{"other.example.org", misdirected},
				{"x.shop.example.com", http.StatusOK},
			} {
				id := uint32(2*i + 1)
				require.NoError(t, h.headers(t, id, true, ":method", "GET", ":scheme", "https", ":authority", tc.authority, ":path", "/"))
				require.Equal(t, tc.want, h.status(t, id), tc.authority)
			}

			want := 0.0
			if on {
				want = 5 // 4 over HTTP/1.1, 1 over HTTP/2
			}
			require.Equal(t, want, metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", "misdirected"))
		})
	}
}
