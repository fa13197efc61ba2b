package regionctl

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestCertsPutRefusesUnusableChain: certs put refuses a chain no client
// could use (600 copies of one certificate; an unrelated intermediate)
// with the reason and writes nothing; a leaf-intermediate chain is
// written.
func TestCertsPutRefusesUnusableChain(t *testing.T) {
	p := prefix(t)
	root := testenv.NewCA(t)
	inter := root.Intermediate(t)
	good := inter.Issue(t, "ecdsa", "shop.example.com")
	leaf := good.CertPEM[:bytes.Index(good.CertPEM, []byte("-----END CERTIFICATE-----\n"))+len("-----END CERTIFICATE-----\n")]
	other := testenv.NewCA(t).Intermediate(t).Issue(t, "ecdsa", "x.example.com")
	otherInter := otherPEM(other.CertPEM)
	dir := t.TempDir()
	put := func(name string, data []byte) result {
		f := filepath.Join(dir, name+".pem")
		require.NoError(t, os.WriteFile(f, data, 0o600))
		return run(t, "--prefix", p, "certs", "put", "--region", "eu-west", name, f)
	}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"copies":    {append(bytes.Repeat(leaf, 600), good.KeyPEM...), "600 certificates"},
		"unrelated": {append(append(append([]byte{}, leaf...), otherInter...), good.KeyPEM...), "is not signed by the next one"},
	} {
		r := put(name, tc.data)
		require.Equal(t, ExitInvalid, r.code, r.String())
		require.Contains(t, r.stderr, "not a certificate the edges would serve: unusable certificate chain")
		require.Contains(t, r.stderr, tc.want)
		require.Contains(t, r.stderr, "nothing was written")
		require.Nil(t, kv(t, euWest, p+"certs/eu-west/"+name))
	}
	r := put("shop", good.Bundle())
	require.Equal(t, ExitOK, r.code, r.String())
	require.NotNil(t, kv(t, euWest, p+"certs/eu-west/shop"))
}

// otherPEM is the last certificate of a PEM chain.
func otherPEM(chain []byte) []byte {
	i := bytes.LastIndex(chain, []byte("-----BEGIN CERTIFICATE-----"))
	return chain[i:]
}
