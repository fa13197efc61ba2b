package edge

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// startTLSConsulEdge starts an edge of region eu-west whose rules and
// certificates come from the Consul agent at addr, with site's directory
// beside them.
func startTLSConsulEdge(t *testing.T, site *tlsSite, addr string, mutate func(*config.Config)) (*running, *syncLog) {
	t.Helper()
	return startLoggedEdge(t, "", func(c *config.Config) {
		c.Rules = ""
		c.Region, c.PoP = "eu-west", "ams"
		c.Consul, c.RulesCache = addr, filepath.Join(t.TempDir(), "rules.yaml")
		c.ListenTLS, c.TLSCertDir = "127.0.0.1:0", site.dir
		if mutate != nil {
			mutate(c)
		}
	})
}

// servedSerial is the serial of the certificate the edge serves for name
// (0 when the handshake fails).
func servedSerial(site *tlsSite, r *running, name string) int64 {
	c, err := site.dialTLS(r, name, nil)
	if err != nil {
		return 0
	}
	defer c.Close()
	return leafSerial(c)
}

func TestTLSCertificatesFromConsul(t *testing.T) {
	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer consul.Close()
	site := newTLSSite(t)
	fromDir := site.put(t, "dir.pem", "ecdsa", "dir.example.com")
	files := t.TempDir()
	certFile := func(l testenv.Leaf) string {
		f := filepath.Join(files, "cert.pem")
		require.NoError(t, os.WriteFile(f, l.Bundle(), 0o600))
		return f
	}
	ctl := func(args ...string) (string, int) {
		return regionctlRun(t, append([]string{"--consul", consul.HTTPAddr()}, args...)...)
	}

	// Written before the edge starts: served from its first handshake.
	v1 := site.ca.Issue(t, "ecdsa", "shop.example.com")
	out, code := ctl("certs", "put", "--region", "eu-west", "shop", certFile(v1))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "edgeguard/certs/eu-west/shop")
	r, logs := startTLSConsulEdge(t, site, consul.HTTPAddr(), nil)
	require.Equal(t, v1.Serial, servedSerial(site, r, "shop.example.com"))
	require.Equal(t, fromDir.Serial, servedSerial(site, r, "dir.example.com"), "the directory's beside Consul's")
	require.Equal(t, float64(2), metricValue(t, r, "edgeguard_tls_certificates"))

	// Rotated: served within 2 s.
	v2 := site.ca.Issue(t, "ecdsa", "shop.example.com")
	out, code = ctl("certs", "put", "--region", "eu-west", "shop", certFile(v2))
	require.Equal(t, 0, code, out)
	written := time.Now()
	require.Eventually(t, func() bool { return servedSerial(site, r, "shop.example.com") == v2.Serial }, 2*time.Second, 20*time.Millisecond)
	t.Logf("rotated certificate served %s after the write", time.Since(written).Round(time.Millisecond))

	// A new one, for another name.
	api1 := site.ca.Issue(t, "rsa", "api.example.com")
	out, code = ctl("certs", "put", "--region", "eu-west", "api", certFile(api1))
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return servedSerial(site, r, "api.example.com") == api1.Serial }, 2*time.Second, 20*time.Millisecond)

	// regionctl refuses an invalid file and writes nothing.
	bad := filepath.Join(files, "bad.pem")
	require.NoError(t, os.WriteFile(bad, v2.CertPEM, 0o600)) // no key
	out, code = ctl("certs", "put", "--region", "eu-west", "shop", bad)
	require.Equal(t, 4, code, out)
	require.Contains(t, out, "nothing was written")

	// Written by hand past regionctl: refused by the edge with a log line
	// naming the key and the reason; the certificate in force stays.
	refusedBefore := metricValue(t, r, "edgeguard_tls_certificate_files_refused_total")
	_, err = consulKV(t, consul).Put(&api.KVPair{Key: "edgeguard/certs/eu-west/shop", Value: v2.CertPEM}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return metricValue(t, r, "edgeguard_tls_certificate_files_refused_total") == refusedBefore+1
	}, 5*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), `msg="certificate from consul refused; keeping the one in force (if any)" key=edgeguard/certs/eu-west/shop reason=`)
	require.Equal(t, v2.Serial, servedSerial(site, r, "shop.example.com"))
	out, code = ctl("certs", "list", "--region", "eu-west")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "shop\tINVALID")
	require.Contains(t, out, "api\tapi.example.com\texpires")

	// Removed: no longer served.
	out, code = ctl("certs", "rm", "--region", "eu-west", "api")
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { return servedSerial(site, r, "api.example.com") == 0 }, 2*time.Second, 20*time.Millisecond)
	_, code = ctl("certs", "rm", "--region", "eu-west", "api")
	require.Equal(t, 1, code)
	_, err = site.dialTLS(r, "api.example.com", nil)
	require.ErrorContains(t, err, "unrecognized name")
}

func TestTLSConsulOnlyStartsWithoutCertificates(t *testing.T) {
	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer consul.Close()
	site := newTLSSite(t)
	r, _ := startTLSConsulEdge(t, site, consul.HTTPAddr(), func(c *config.Config) { c.TLSCertDir = "" })
	require.Equal(t, int64(0), servedSerial(site, r, "shop.example.com"))
	l := site.ca.Issue(t, "ecdsa", "shop.example.com")
	_, err = consulKV(t, consul).Put(&api.KVPair{Key: "edgeguard/certs/eu-west/shop", Value: l.Bundle()}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return servedSerial(site, r, "shop.example.com") == l.Serial }, 2*time.Second, 20*time.Millisecond)
}

func consulKV(t *testing.T, c *testenv.Consul) *api.KV {
	cl, err := c.Client("")
	require.NoError(t, err)
	return cl.KV()
}
