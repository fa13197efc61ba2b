package edge

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/stretchr/testify/require"
)

// TestTLSUnusableChainRefused: a bundle of 600 copies of one certificate
// (357 KB: OpenSSL's clients, curl's, fail every handshake with
// "excessive message size"; Go's takes up to 256 KiB) is
// refused from the certificate directory and from Consul, named with why,
// and the certificate in force keeps serving a real TLS client; edge
// check reports it. A leaf-intermediate chain is served and verifies
// against the root.
func TestTLSUnusableChainRefused(t *testing.T) {
	site := newTLSSite(t)
	inter := site.ca.Intermediate(t)
	good := inter.Issue(t, "ecdsa", "shop.example.com")
	writeAtomically(t, filepath.Join(site.dir, "shop.pem"), good.Bundle())
	r, logs := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	serve := func(name string) int64 {
		t.Helper()
		c, err := site.dialTLS(r, name, nil) // verifies against the root
		require.NoError(t, err)
		defer c.Close()
		require.Len(t, c.ConnectionState().PeerCertificates, 2, "leaf and intermediate")
		return leafSerial(c)
	}
	require.Equal(t, good.Serial, serve("shop.example.com"))

	// The rotation gone wrong: a new certificate for the name, concatenated
	// 600 times.
	next := inter.Issue(t, "ecdsa", "shop.example.com")
	leafPEM := next.CertPEM[:bytes.Index(next.CertPEM, []byte("-----END CERTIFICATE-----\n"))+len("-----END CERTIFICATE-----\n")]
	bundle := append(bytes.Repeat(leafPEM, 600), next.KeyPEM...)
	require.Greater(t, len(bundle), 300_000)

	refused := metricValue(t, r, "edgeguard_tls_certificate_files_refused_total")
	writeAtomically(t, filepath.Join(site.dir, "shop.pem"), bundle)
	require.Eventually(t, func() bool {
		return metricValue(t, r, "edgeguard_tls_certificate_files_refused_total") == refused+1
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), "600 certificates")
	require.Equal(t, good.Serial, serve("shop.example.com"), "the last good certificate serves")

	// From Consul: the same validation, the same outcome.
	api := inter.Issue(t, "ecdsa", "api.example.com")
	r.front.TLS.Certificates().ApplyConsul(map[string][]byte{"api": api.Bundle()})
	require.Equal(t, api.Serial, serve("api.example.com"))
	apiLeaf := api.CertPEM[:bytes.Index(api.CertPEM, []byte("-----END CERTIFICATE-----\n"))+len("-----END CERTIFICATE-----\n")]
	r.front.TLS.Certificates().ApplyConsul(map[string][]byte{"api": append(bytes.Repeat(apiLeaf, 600), api.KeyPEM...)})
	require.Equal(t, refused+2, metricValue(t, r, "edgeguard_tls_certificate_files_refused_total"))
	require.Equal(t, api.Serial, serve("api.example.com"))

	// edge check reads the directory as the edge does.
	var out, errOut strings.Builder
	code := check.Run([]string{"--demo-origin", "--listen-tls", "127.0.0.1:0", "--tls-cert-dir", site.dir}, nil, &out, &errOut)
	require.Equal(t, 1, code, out.String()+errOut.String())
	require.Contains(t, out.String(), "certificate "+filepath.Join(site.dir, "shop")+": unusable certificate chain: 600 certificates")
	writeAtomically(t, filepath.Join(site.dir, "shop.pem"), good.Bundle())
	out.Reset()
	require.Equal(t, 0, check.Run([]string{"--demo-origin", "--listen-tls", "127.0.0.1:0", "--tls-cert-dir", site.dir}, nil, &out, &errOut), out.String())

	// And the rate limit service's certificate, as its listener reads it.
	rlsDir, certDir := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(rlsDir, "rls.yaml"), []byte(rlsDoc), 0o600))
	rlsCert, rlsKey := filepath.Join(certDir, "rls.crt"), filepath.Join(certDir, "rls.key")
	require.NoError(t, os.WriteFile(rlsCert, bytes.Repeat(leafPEM, 600), 0o600))
	require.NoError(t, os.WriteFile(rlsKey, next.KeyPEM, 0o600))
	rlsArgs := []string{"--demo-origin", "--rls-listen", "127.0.0.1:0", "--rls-config-dir", rlsDir, "--rls-tls-cert", rlsCert, "--rls-tls-key", rlsKey}
	out.Reset()
	require.Equal(t, 1, check.Run(rlsArgs, []string{"EDGEGUARD_KEY_SALT=check-salt-of-the-rls"}, &out, &errOut), out.String()+errOut.String())
	require.Contains(t, out.String(), "rls-tls-cert "+rlsCert+": ")
	require.Contains(t, out.String(), "600 certificates")
	require.NoError(t, os.WriteFile(rlsCert, next.CertPEM, 0o600))
	out.Reset()
	require.Equal(t, 0, check.Run(rlsArgs, []string{"EDGEGUARD_KEY_SALT=check-salt-of-the-rls"}, &out, &errOut), out.String()+errOut.String())
}
