package edge

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// tlsSite is a certificate directory and the CA its certificates chain to.
type tlsSite struct {
	ca  *testenv.CA
	dir string
}

func newTLSSite(t *testing.T) *tlsSite {
	return &tlsSite{ca: testenv.NewCA(t), dir: t.TempDir()}
}

// put issues a certificate for names and writes it as file (chain + key).
func (s *tlsSite) put(t *testing.T, file, keyType string, names ...string) testenv.Leaf {
	t.Helper()
	l := s.ca.Issue(t, keyType, names...)
	writeAtomically(t, filepath.Join(s.dir, file), l.Bundle())
	return l
}

// writeAtomically replaces a file as certificate tooling does (write, rename).
func writeAtomically(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	require.NoError(t, os.WriteFile(tmp, data, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// dialTLS completes a handshake with the edge's TLS listener.
func (s *tlsSite) dialTLS(r *running, name string, mutate func(*tls.Config)) (*tls.Conn, error) {
	cfg := &tls.Config{ServerName: name, RootCAs: s.ca.Pool, NextProtos: []string{"http/1.1"}}
	if mutate != nil {
		mutate(cfg)
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", r.TLSAddr(), cfg)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	}
	return c, err
}

func leafSerial(c *tls.Conn) int64 {
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// tlsGet sends one keep-alive request on c and reads the response.
func tlsGet(t *testing.T, c net.Conn, br *bufio.Reader, host, path string) (*http.Response, []byte) {
	t.Helper()
	_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	return resp, body
}

func startTLSEdge(t *testing.T, site *tlsSite, rulesYAML string, mutate func(*config.Config)) (*running, *syncLog) {
	return startLoggedEdge(t, rulesYAML, func(c *config.Config) {
		c.ListenTLS, c.TLSCertDir = "127.0.0.1:0", site.dir
		if mutate != nil {
			mutate(c)
		}
	})
}

func TestTLSCertificateBySNI(t *testing.T) {
	site := newTLSSite(t)
	shop := site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	wild := site.put(t, "wild.pem", "ecdsa", "*.example.com")
	wwwEC := site.put(t, "www-ecdsa.pem", "ecdsa", "www.example.com")
	wwwRSA := site.put(t, "www-rsa.pem", "rsa", "www.example.com")
	r, _ := startTLSEdge(t, site, perIP, nil)

	for _, tc := range []struct {
		name   string
		sni    string
		mutate func(*tls.Config)
		want   int64
	}{
		{"exact", "shop.example.com", nil, shop.Serial},
		{"wildcard", "api.example.com", nil, wild.Serial},
		{"ECDSA for a TLS 1.3 client", "www.example.com", nil, wwwEC.Serial},
		{"RSA for a client with RSA suites only", "www.example.com", func(c *tls.Config) {
			c.MaxVersion, c.CipherSuites = tls.VersionTLS12, []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
		}, wwwRSA.Serial},
		{"ECDSA for a TLS 1.2 client with ECDSA suites", "www.example.com", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
		}, wwwEC.Serial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := site.dialTLS(r, tc.sni, tc.mutate)
			require.NoError(t, err)
			defer c.Close()
			require.Equal(t, tc.want, leafSerial(c))
			require.Equal(t, "http/1.1", c.ConnectionState().NegotiatedProtocol)
		})
	}

	t.Run("unknown name and no SNI fail without a default", func(t *testing.T) {
		before := metricSum(t, r, "edgeguard_tls_handshakes_total", "result", "no_cert")
		_, err := site.dialTLS(r, "a.b.example.com", nil) // a wildcard covers one label
		require.ErrorContains(t, err, "unrecognized name")
		_, err = site.dialTLS(r, "", func(c *tls.Config) { c.InsecureSkipVerify = true })
		require.Error(t, err)
		require.Eventually(t, func() bool {
			return metricSum(t, r, "edgeguard_tls_handshakes_total", "result", "no_cert") == before+2
		}, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("below TLS 1.2 refused", func(t *testing.T) {
		_, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS11, tls.VersionTLS11 })
		require.Error(t, err)
		require.Eventually(t, func() bool {
			return metricSum(t, r, "edgeguard_tls_handshakes_total", "result", "bad_version") == 1
		}, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("limits, trust model and forwarding fields over TLS", func(t *testing.T) {
		c, err := site.dialTLS(r, "shop.example.com", nil)
		require.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		var got []int
		for i := range 4 {
			_, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Forwarded-Proto: http\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			got = append(got, resp.StatusCode)
			if i == 0 {
				echo := echoed(t, body)
				require.Equal(t, "https", echo["proto"], "X-Forwarded-Proto from the real connection")
				require.Contains(t, echo["fwd"], "proto=https")
				require.Equal(t, "127.0.0.1", echo["xff"], "an untrusted client's X-Forwarded-For dropped")
				require.Equal(t, `"per-ip";q=3;w=60`, resp.Header.Get("RateLimit-Policy"))
			}
		}
		require.Equal(t, []int{200, 200, 200, 429}, got)
		require.Equal(t, []int{429}, codes(t, r, 1, "/"), "one client over plain HTTP and TLS")
	})

	t.Run("resumption counted", func(t *testing.T) {
		cache := tls.NewLRUClientSessionCache(4)
		before := metricValue(t, r, "edgeguard_tls_resumptions_total")
		for i := range 2 {
			c, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.ClientSessionCache = cache })
			require.NoError(t, err)
			// A TLS 1.3 ticket arrives after the handshake: one request reads it.
			resp, _ := tlsGet(t, c, bufio.NewReader(c), "shop.example.com", "/")
			require.Equal(t, 429, resp.StatusCode) // the per-ip limit is spent: still an answer
			require.Equal(t, i == 1, c.ConnectionState().DidResume)
			c.Close()
		}
		require.Equal(t, before+1, metricValue(t, r, "edgeguard_tls_resumptions_total"))
	})
}

func TestTLSDefaultCertificate(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	def := site.ca.Issue(t, "ecdsa", "edge.invalid")
	defFile := filepath.Join(t.TempDir(), "default.pem")
	require.NoError(t, os.WriteFile(defFile, def.Bundle(), 0o600))
	r, _ := startTLSEdge(t, site, perIP, func(c *config.Config) { c.TLSDefaultCert = defFile })
	for _, name := range []string{"unknown.test", ""} {
		c, err := site.dialTLS(r, name, func(c *tls.Config) { c.InsecureSkipVerify = true })
		require.NoError(t, err, name)
		require.Equal(t, def.Serial, leafSerial(c), name)
		c.Close()
	}
	require.Equal(t, float64(2), metricValue(t, r, "edgeguard_tls_certificates"))
}

func TestTLSCertificateReload(t *testing.T) {
	site := newTLSSite(t)
	first := site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, logs := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)

	open, err := site.dialTLS(r, "shop.example.com", nil)
	require.NoError(t, err)
	defer open.Close()
	br := bufio.NewReader(open)
	resp, _ := tlsGet(t, open, br, "shop.example.com", "/")
	require.Equal(t, 200, resp.StatusCode)

	// Rotated: a new client sees the new certificate within 2 s.
	second := site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	rotated := time.Now()
	require.Eventually(t, func() bool {
		c, err := site.dialTLS(r, "shop.example.com", nil)
		if err != nil {
			return false
		}
		defer c.Close()
		return leafSerial(c) == second.Serial
	}, 2*time.Second, 20*time.Millisecond)
	t.Logf("rotated certificate served after %s", time.Since(rotated))
	resp, _ = tlsGet(t, open, br, "shop.example.com", "/")
	require.Equal(t, 200, resp.StatusCode, "a keep-alive connection opened before the rotation keeps working")
	require.Equal(t, first.Serial, leafSerial(open))

	// A new name appears.
	added := site.put(t, "new.pem", "rsa", "new.example.com")
	require.Eventually(t, func() bool {
		c, err := site.dialTLS(r, "new.example.com", nil)
		if err != nil {
			return false
		}
		defer c.Close()
		return leafSerial(c) == added.Serial
	}, 2*time.Second, 20*time.Millisecond)

	// An invalid file is refused, named in the log, and the certificate
	// in force stays.
	refusedBefore := metricValue(t, r, "edgeguard_tls_certificate_files_refused_total")
	other := site.ca.Issue(t, "ecdsa", "shop.example.com")
	wrongKey := site.ca.Issue(t, "ecdsa", "shop.example.com")
	writeAtomically(t, filepath.Join(site.dir, "shop.pem"), append(other.CertPEM, wrongKey.KeyPEM...))
	require.Eventually(t, func() bool {
		return metricValue(t, r, "edgeguard_tls_certificate_files_refused_total") == refusedBefore+1
	}, 3*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), "file="+filepath.Join(site.dir, "shop"))
	require.Contains(t, logs.String(), "private key does not match public key")
	c, err := site.dialTLS(r, "shop.example.com", nil)
	require.NoError(t, err)
	require.Equal(t, second.Serial, leafSerial(c))
	c.Close()
	require.GreaterOrEqual(t, metricValue(t, r, "edgeguard_tls_certificate_reloads_total"), float64(3))
}

func TestTLSWithCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	require.NoError(t, err, "curl is installed by scripts/tools.sh (make tools)")
	site := newTLSSite(t)
	site.put(t, "www-ecdsa.pem", "ecdsa", "www.example.com")
	site.put(t, "www-rsa.pem", "rsa", "www.example.com")
	site.put(t, "wild.pem", "ecdsa", "*.example.net")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, site.ca.PEM, 0o600))
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	_, port, err := net.SplitHostPort(r.TLSAddr())
	require.NoError(t, err)
	run := func(name string, args ...string) (string, string, error) {
		cmd := exec.Command(curl, append([]string{"-sS", "-v", "--max-time", "10", "-w", "\n%{certs}", "--resolve", name + ":" + port + ":127.0.0.1", "--cacert", caFile,
			"https://" + name + ":" + port + "/"}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out), stderr.String(), err
	}

	// body, then curl's description of the certificate chain
	split := func(out string) (map[string]string, string) {
		body, certs, _ := strings.Cut(out, "\n")
		return echoed(t, []byte(body)), certs
	}
	out, verbose, err := run("www.example.com")
	require.NoError(t, err, verbose)
	echo, certs := split(out)
	require.Equal(t, "https", echo["proto"])
	require.Contains(t, certs, "id-ecPublicKey", "an ECDSA certificate for a client that takes it")

	out, verbose, err = run("www.example.com", "--tls-max", "1.2", "--ciphers", "ECDHE-RSA-AES128-GCM-SHA256")
	require.NoError(t, err, verbose)
	_, certs = split(out)
	require.Contains(t, certs, "rsaEncryption", "the RSA certificate for an RSA-only client")

	out, verbose, err = run("api.example.net")
	require.NoError(t, err, verbose)
	echo, certs = split(out)
	require.Equal(t, "https", echo["proto"])
	require.Contains(t, certs, "*.example.net")

	_, verbose, err = run("unknown.example.org")
	require.Error(t, err, "no certificate for the name: the handshake fails")
	require.Contains(t, strings.ToLower(verbose), "unrecognized name", verbose)
}

// proxyHeader writes a PROXY header (v1 or v2) naming client on c.
func proxyHeader(t *testing.T, c net.Conn, version byte, client string) {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(version, &net.TCPAddr{IP: net.ParseIP(client), Port: 40000}, c.RemoteAddr())
	_, err := h.WriteTo(c)
	require.NoError(t, err)
}

func TestProxyProtocol(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, logs := startTLSEdge(t, site, perIP, func(c *config.Config) {
		c.ProxyProtocolFrom = []netip.Prefix{mustPrefix("127.0.0.2/32")}
		c.TrustedProxies = trust.Set{mustPrefix("192.0.2.0/24")}
		c.MaxConnsPerIP = 2
	})

	for _, version := range []byte{1, 2} {
		t.Run(fmt.Sprintf("v%d from the balancer, plain and TLS", version), func(t *testing.T) {
			client := "203.0.113." + string('0'+version)
			c := dialFrom(t, "127.0.0.2", r.Addr())
			proxyHeader(t, c, version, client)
			resp, body := c.do(t, "GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, client, echoed(t, body)["xff"], "the client the header names, untrusted: its own XFF dropped")

			raw := dialFrom(t, "127.0.0.2", r.TLSAddr())
			proxyHeader(t, raw, version, client)
			tc := tls.Client(raw, &tls.Config{ServerName: "shop.example.com", RootCAs: site.ca.Pool})
			resp, body = tlsGet(t, tc, bufio.NewReader(tc), "shop.example.com", "/")
			require.Equal(t, 200, resp.StatusCode)
			echo := echoed(t, body)
			require.Equal(t, client, echo["xff"])
			require.Equal(t, "https", echo["proto"])

			// The per-client cap (2) counts the client, not the balancer,
			// over both listeners: a third connection for the client is
			// refused, one for another client is not.
			again := dialFrom(t, "127.0.0.2", r.Addr())
			proxyHeader(t, again, version, client)
			resp, _ = again.do(t, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
			require.Equal(t, 429, resp.StatusCode)
			other := dialFrom(t, "127.0.0.2", r.Addr())
			proxyHeader(t, other, version, "198.51.100.9")
			resp, _ = other.do(t, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
			require.Equal(t, 200, resp.StatusCode)
		})
	}

	t.Run("the client a PROXY header names is trusted only in --trusted-proxies", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.2", r.Addr())
		proxyHeader(t, c, 2, "192.0.2.10")
		resp, body := c.do(t, "GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Forwarded-For: 198.51.100.50\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, "198.51.100.50, 192.0.2.10", echoed(t, body)["xff"], "a trusted proxy behind the balancer: its hop kept")
	})

	t.Run("a PROXY header from anyone else is refused", func(t *testing.T) {
		before := metricSum(t, r, "edgeguard_edge_proxy_protocol_refused_total", "reason", "untrusted_source")
		for _, addr := range []string{r.Addr(), r.TLSAddr()} {
			c := dialFrom(t, "127.0.0.3", addr)
			proxyHeader(t, c, 2, "203.0.113.77")
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
			_, err := http.ReadResponse(c.r, nil)
			require.Error(t, err, "connection closed without an answer")
		}
		require.Equal(t, before+2, metricSum(t, r, "edgeguard_edge_proxy_protocol_refused_total", "reason", "untrusted_source"))
		resp, body := dialFrom(t, "127.0.0.3", r.Addr()).do(t, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode, "a plain connection is served as is")
		require.Equal(t, "127.0.0.3", echoed(t, body)["xff"])
	})

	t.Run("the balancer without a header is refused and logged", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.2", r.Addr())
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
		_, err := http.ReadResponse(c.r, nil)
		require.Error(t, err)
		require.Equal(t, float64(1), metricSum(t, r, "edgeguard_edge_proxy_protocol_refused_total", "reason", "missing_header"))
		require.Contains(t, logs.String(), "without a PROXY header refused")
	})
}

// Two edges reading one ticket-key file resume each other's sessions; an
// edge with its own keys does not. A rotation (a new first key, the old one
// kept) still resumes the old tickets.
func TestTLSTicketKeysShared(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	keys := filepath.Join(t.TempDir(), "tickets")
	const k1 = "0000000000000000000000000000000000000000000000000000000000000001"
	const k2 = "0000000000000000000000000000000000000000000000000000000000000002"
	require.NoError(t, os.WriteFile(keys, []byte("# PoP ams\n"+k1+"\n"), 0o600))
	shared := func(c *config.Config) { c.TLSTicketKeys = keys }
	a, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", shared)
	b, logs := startTLSEdge(t, site, "version: 1\nrules: []\n", shared)
	own, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)

	// connect completes a handshake and one request (a TLS 1.3 ticket
	// arrives after the handshake) and says whether it resumed.
	connect := func(r *running, cache tls.ClientSessionCache, version uint16) bool {
		c, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.ClientSessionCache, c.MaxVersion = cache, version })
		require.NoError(t, err)
		defer c.Close()
		resp, _ := tlsGet(t, c, bufio.NewReader(c), "shop.example.com", "/")
		require.Equal(t, 200, resp.StatusCode)
		return c.ConnectionState().DidResume
	}
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(version), func(t *testing.T) {
			cache := tls.NewLRUClientSessionCache(4)
			require.False(t, connect(a, cache, version))
			require.True(t, connect(b, cache, version), "a ticket from edge a resumes on edge b")
			cache = tls.NewLRUClientSessionCache(4)
			require.False(t, connect(a, cache, version))
			require.False(t, connect(own, cache, version), "an edge with its own keys cannot read the ticket")
		})
	}

	// Rotation: k2 encrypts from now on, k1 still decrypts.
	c := tls.NewLRUClientSessionCache(4)
	require.False(t, connect(a, c, tls.VersionTLS13))
	writeAtomically(t, keys, []byte(k2+"\n"+k1+"\n"))
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "session ticket keys loaded") == 2 }, 3*time.Second, 20*time.Millisecond)
	require.True(t, connect(b, c, tls.VersionTLS13), "a ticket under the previous key resumes")

	// An invalid file is refused and the keys in force stay.
	writeAtomically(t, keys, []byte("not hex\n"))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "session ticket keys refused") }, 3*time.Second, 20*time.Millisecond)
	c = tls.NewLRUClientSessionCache(4)
	require.False(t, connect(b, c, tls.VersionTLS13))
	require.True(t, connect(b, c, tls.VersionTLS13))
}
