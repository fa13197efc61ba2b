package certstore

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// serveStore answers TLS handshakes on loopback from s until the test
// ends.
func serveStore(t *testing.T, s *Store) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, &tls.Config{GetCertificate: s.Certificate})
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				_ = tc.Handshake()
				_, _ = tc.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake is a real crypto/tls client's handshake, verifying against
// roots; it returns the leaf's serial.
func handshake(addr, name string, roots *x509.CertPool) (int64, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: name, RootCAs: roots})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// copies is the 600-copy bundle: one certificate concatenated again and
// again, then the key.
func copies(l testenv.Leaf, n int) []byte {
	return append(bytes.Repeat(l.CertPEM, n), l.KeyPEM...)
}

// pemBlocks splits a PEM chain into its certificates.
func pemBlocks(t *testing.T, chain []byte) [][]byte {
	var out [][]byte
	for {
		var b *pem.Block
		b, chain = pem.Decode(chain)
		if b == nil {
			return out
		}
		out = append(out, pem.EncodeToMemory(b))
	}
}

// TestChainRefusedUnlessUsable: a certificate no client could use is
// refused with a clear error, whichever way it comes (directory, Replace,
// Check), and the one in force keeps serving real clients; a good
// leaf-intermediate chain is served and verifies against the root.
func TestChainRefusedUnlessUsable(t *testing.T) {
	root := testenv.NewCA(t)
	inter := root.Intermediate(t)
	good := inter.Issue(t, "ecdsa", "shop.example.com")
	require.Len(t, pemBlocks(t, good.CertPEM), 2, "leaf and intermediate")

	dir := t.TempDir()
	write(t, dir, "shop.pem", good.Bundle())
	s := New(dir, "")
	require.Empty(t, scan(t, s).Refused)
	s.Replace("consul", map[string][]byte{"api": inter.Issue(t, "ecdsa", "api.example.com").Bundle()})
	addr := serveStore(t, s)
	serial, err := handshake(addr, "shop.example.com", root.Pool)
	require.NoError(t, err, "a client verifying against the root")
	require.Equal(t, good.Serial, serial)
	apiSerial, err := handshake(addr, "api.example.com", root.Pool)
	require.NoError(t, err)

	// A leaf alone, its intermediate missing: clients cannot verify it,
	// but it is a chain of one; refusing it is the client's business
	// (verification), not the store's. It is accepted as before.
	leafOnly := inter.Issue(t, "ecdsa", "alone.example.com")
	_, _, err = Check(append(pemBlocks(t, leafOnly.CertPEM)[0], leafOnly.KeyPEM...))
	require.NoError(t, err)

	leaf, interPEM := pemBlocks(t, good.CertPEM)[0], pemBlocks(t, good.CertPEM)[1]
	otherRoot := testenv.NewCA(t)
	otherInter := otherRoot.Intermediate(t).Issue(t, "ecdsa", "x.example.com")
	huge := hugeLeaf(t, root)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"600 copies of one certificate", copies(testenv.Leaf{CertPEM: leaf, KeyPEM: good.KeyPEM}, 600), "600 certificates"},
		{"600 copies of the chain", copies(good, 300), "600 certificates"},
		{"the leaf twice", append(append(append([]byte{}, leaf...), leaf...), good.KeyPEM...), "certificate 1 of 2"},
		// crypto/tls takes the first certificate for the leaf: an
		// intermediate first fails on the key.
		{"intermediate first", append(append(append([]byte{}, interPEM...), leaf...), good.KeyPEM...), "private key does not match"},
		{"root before the intermediate", append(append(append(append([]byte{}, leaf...), root.PEM...), interPEM...), good.KeyPEM...), "certificate 1 of 3"},
		{"an unrelated intermediate", append(append(append([]byte{}, leaf...), pemBlocks(t, otherInter.CertPEM)[1]...), good.KeyPEM...), "is not signed by the next one"},
		{"six certificates", append(append(append([]byte{}, good.CertPEM...), bytes.Repeat(root.PEM, 4)...), good.KeyPEM...), "6 certificates"},
		{"larger than a client takes", huge.Bundle(), "bytes of certificates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Check(tc.data)
			require.ErrorContains(t, err, tc.want)

			// The directory: refused, the good one keeps serving.
			write(t, dir, "shop.pem", tc.data)
			bumpMtime(t, dir, "shop.pem")
			rep := scan(t, s)
			require.Len(t, rep.Refused, 1)
			require.ErrorContains(t, rep.Refused[0].Err, tc.want)
			serial, err := handshake(addr, "shop.example.com", root.Pool)
			require.NoError(t, err, "the last good certificate serves")
			require.Equal(t, good.Serial, serial)

			// Replace (Consul): the same.
			rr := s.Replace("consul", map[string][]byte{"api": tc.data})
			require.Len(t, rr.Refused, 1)
			require.ErrorContains(t, rr.Refused[0].Err, tc.want)
			serial, err = handshake(addr, "api.example.com", root.Pool)
			require.NoError(t, err)
			require.Equal(t, apiSerial, serial)
		})
	}
	_, _, err = Check(copies(good, 600))
	require.True(t, errors.Is(err, ErrChain))
}

// bumpMtime makes a rewrite of the same size visible to Scan's stamp.
func bumpMtime(t *testing.T, dir, name string) {
	t.Helper()
	later := time.Now().Add(time.Duration(time.Now().UnixNano()%1000+1) * time.Millisecond)
	require.NoError(t, os.Chtimes(filepath.Join(dir, name), later, later))
}

// hugeLeaf is a certificate larger than MaxChainBytes alone: thousands of
// names.
func hugeLeaf(t *testing.T, ca *testenv.CA) testenv.Leaf {
	names := make([]string, 0, 3000)
	for i := range cap(names) {
		names = append(names, fmt.Sprintf("host-%04d.shop.example.com", i))
	}
	names[0] = "shop.example.com"
	return ca.Issue(t, "ecdsa", names...)
}

// TestValidateRoot: a chain ending in a self-signed root is usable (some
// send it); a lone self-signed certificate is too.
func TestValidateRoot(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "self"}, DNSNames: []string{"self.example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	require.NoError(t, Validate(&tls.Certificate{Certificate: [][]byte{der}}))

	root := testenv.NewCA(t)
	good := root.Intermediate(t).Issue(t, "ecdsa", "shop.example.com")
	_, _, err = Check(append(append(append([]byte{}, good.CertPEM...), root.PEM...), good.KeyPEM...))
	require.NoError(t, err, "leaf, intermediate, root")
}
