package rls_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestTLSConfigRefusesUnusableChain: --rls-tls-cert goes through the
// edge's certificate validation: 600 copies of the leaf are refused, the
// leaf and its intermediate accepted.
func TestTLSConfigRefusesUnusableChain(t *testing.T) {
	good := testenv.NewCA(t).Intermediate(t).Issue(t, "ecdsa", "rls.example.com")
	leaf := good.CertPEM[:bytes.Index(good.CertPEM, []byte("-----END CERTIFICATE-----\n"))+len("-----END CERTIFICATE-----\n")]
	dir := t.TempDir()
	keyFile, goodFile, badFile := filepath.Join(dir, "k.pem"), filepath.Join(dir, "good.pem"), filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(keyFile, good.KeyPEM, 0o600))
	require.NoError(t, os.WriteFile(goodFile, good.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(badFile, bytes.Repeat(leaf, 600), 0o600))
	_, err := rls.TLSConfig(badFile, keyFile, "")
	require.ErrorContains(t, err, "loading the rate limit service's certificate: unusable certificate chain: 600 certificates")
	c, err := rls.TLSConfig(goodFile, keyFile, "")
	require.NoError(t, err)
	require.Len(t, c.Certificates[0].Certificate, 2)
}
