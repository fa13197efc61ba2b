package edge

import (
	"crypto/tls"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestACMESharedAcrossEdges: two edges sharing one Consul obtain one
// certificate from an ACME server, and both serve its renewal. Parallel (its
// Consul, Pebble and edges are its own): most of its time is the wait for
// the renewal, a third of the 30 s lifetime before expiry.
func TestACMESharedAcrossEdges(t *testing.T) {
	t.Parallel()
	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer consul.Close()
	ports, err := testenv.FreePorts(2)
	require.NoError(t, err)
	// Pebble validates every challenge on edge a's port, whichever edge
	// asked: b's challenges are answered by a from the shared state.
	pebble := testenv.StartPebble(t, testenv.PebbleOptions{TLSALPNPort: ports[0], Validity: 30 * time.Second})
	site := newTLSSite(t)
	acme := func(port int) func(*config.Config) {
		return func(c *config.Config) {
			c.ListenTLS, c.TLSCertDir = "127.0.0.1:"+strconv.Itoa(port), ""
			c.ACMEDomains, c.ACMEEmail = []string{"shop.example.com"}, "ops@example.com"
			c.ACMECA, c.ACMECARoot = pebble.DirectoryURL, pebble.RootFile
			c.ACMERenewCheck = time.Second
		}
	}
	a, alog := startTLSConsulEdge(t, site, consul.HTTPAddr(), acme(ports[0]))
	b, blog := startTLSConsulEdge(t, site, consul.HTTPAddr(), acme(ports[1]))
	defer func() {
		if t.Failed() {
			t.Logf("edge a:\n%s\nedge b:\n%s", alog, blog)
		}
	}()

	// served is the Pebble-issued leaf r serves for the name (nil until
	// there is one).
	served := func(r *running) (serial string, notAfter time.Time) {
		c, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.InsecureSkipVerify = true })
		if err != nil {
			return "", time.Time{}
		}
		defer c.Close()
		leaf := c.ConnectionState().PeerCertificates[0]
		if !strings.HasPrefix(leaf.Issuer.CommonName, "Pebble") {
			return "", time.Time{}
		}
		return leaf.SerialNumber.String(), leaf.NotAfter
	}
	obtained := func() float64 {
		return metricSum(t, a, "edgeguard_tls_acme_events_total", "event", "cert_obtained") +
			metricSum(t, b, "edgeguard_tls_acme_events_total", "event", "cert_obtained")
	}
	var first string
	require.Eventually(t, func() bool {
		sa, _ := served(a)
		sb, _ := served(b)
		first = sa
		return sa != "" && sa == sb
	}, 60*time.Second, 100*time.Millisecond, "both edges serve one certificate from the ACME server")
	require.Equal(t, float64(1), obtained(), "one edge obtained it; the other loaded it")

	// Renewal: a third of the 30 s lifetime before expiry one edge renews,
	// both serve the new one.
	require.Eventually(t, func() bool {
		sa, _ := served(a)
		sb, _ := served(b)
		return sa != "" && sa != first && sa == sb
	}, 60*time.Second, 200*time.Millisecond, "both edges serve the renewed certificate")
	require.GreaterOrEqual(t, obtained(), float64(2))
	require.Contains(t, alog.String()+blog.String(), `msg="acme certificate event" event=cert_obtained identifier=shop.example.com renewal=true`)
}
