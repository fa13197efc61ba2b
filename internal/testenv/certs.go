package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a test certificate authority: it issues leaf certificates for the
// TLS tests, whose clients trust Pool.
type CA struct {
	cert   *x509.Certificate
	key    crypto.Signer
	PEM    []byte // the CA certificate, for curl --cacert
	Pool   *x509.CertPool
	serial atomic.Int64
	// chain is the PEM of this CA's certificate and its issuers' up to
	// (not including) the root, for an intermediate; leaves it issues
	// carry it after their own.
	chain []byte
}

// Intermediate is a CA that ca signed: the leaves it issues carry the
// chain leaf, intermediate (and ca's own intermediates); clients trust
// the root's Pool.
func (ca *CA) Intermediate(t testing.TB) *CA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(ca.serial.Add(1)),
		Subject:               pkix.Name{CommonName: "edgeguard test intermediate"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	own := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	in := &CA{cert: cert, key: key, PEM: own, Pool: ca.Pool, chain: append(own, ca.chain...)}
	in.serial.Store(ca.serial.Add(1000))
	return in
}

// NewCA makes a fresh ECDSA P-256 CA.
func NewCA(t testing.TB) *CA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edgeguard test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	ca := &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.serial.Store(100)
	return ca
}

// Leaf is an issued certificate: chain and key as PEM, and its serial.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Serial          int64
}

// Bundle is the chain followed by the key, as one .pem file holds them.
func (l Leaf) Bundle() []byte { return append(append([]byte(nil), l.CertPEM...), l.KeyPEM...) }

// Issue signs a leaf for names with a fresh key: "ecdsa" (P-256) or "rsa"
// (2048 bits).
func (ca *CA) Issue(t testing.TB, keyType string, names ...string) Leaf {
	var key crypto.Signer
	var err error
	switch keyType {
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	require.NoError(t, err)
	return ca.IssueWithKey(t, key, names...)
}

// IssueWithKey signs a leaf for names with the given key.
func (ca *CA) IssueWithKey(t testing.TB, key crypto.Signer, names ...string) Leaf {
	serial := ca.serial.Add(1)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return Leaf{
		CertPEM: append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.chain...),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Serial:  serial,
	}
}

// IssueClient signs a client certificate (extended key usage clientAuth)
// for mutual TLS tests.
func (ca *CA) IssueClient(t testing.TB, name string) Leaf {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial := ca.serial.Add(1)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Serial:  serial,
	}
}
