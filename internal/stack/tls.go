package stack

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// The stack's edges serve TLS for TLSName (and its subdomains) with a
// certificate the stack issues from its own CA and puts into every region's
// Consul KV with regionctl certs put, as an operator would: the edges read
// it from there (no file on the edges).
const TLSName = "edge.local"

// TLSFiles are the stack's CA (clients trust it) and the edges' certificate
// (chain and key, PEM) under the state dir.
func (st State) TLSFiles() (ca, cert string) {
	dir := filepath.Join(st.Dir, "tls")
	return filepath.Join(dir, "ca.pem"), filepath.Join(dir, "edge.pem")
}

// ensureTLS issues the CA and the edges' certificate once per state dir.
func (st State) ensureTLS() (ca, cert string, err error) {
	ca, cert = st.TLSFiles()
	if _, err := os.Stat(cert); err == nil {
		return ca, cert, nil
	}
	if err := os.MkdirAll(filepath.Dir(ca), 0o700); err != nil {
		return "", "", err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edgeguard stack CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: TLSName},
		DNSNames:     []string{TLSName, "*." + TLSName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(0, 3, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return "", "", err
	}
	// Written last: its presence says both files are complete.
	return ca, cert, os.WriteFile(cert, chain, 0o600)
}

// TLSClientConfig trusts the stack's CA and asks for TLSName.
func (st State) TLSClientConfig() (*tls.Config, error) {
	ca, _ := st.TLSFiles()
	pemCA, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return nil, fmt.Errorf("%s: no certificate", ca)
	}
	return &tls.Config{RootCAs: pool, ServerName: TLSName, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// tlsReady is nil once the edge completes a verified handshake for TLSName
// on its TLS port (the certificate from Consul is in force).
func tlsReady(ctx context.Context, cfg *tls.Config, e EdgeSpec) error {
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(e.Addr, strconv.Itoa(e.TLSPort)))
	if err != nil {
		return err
	}
	defer c.Close()
	if len(c.(*tls.Conn).ConnectionState().PeerCertificates) == 0 {
		return errors.New("no certificate")
	}
	return nil
}

// putTLS issues the stack's certificate (once) and puts it into every
// region's Consul KV when some edge serves TLS.
func (st State) putTLS(ctx context.Context, specs []Spec, servers []consulServer, logw io.Writer) error {
	bin, tlsEdges := "", false
	for _, s := range specs {
		bin = s.Bin
		tlsEdges = tlsEdges || s.Edge != nil && s.Edge.TLSPort > 0
	}
	if !tlsEdges || len(servers) == 0 {
		return nil
	}
	_, cert, err := st.ensureTLS()
	if err != nil {
		return fmt.Errorf("issuing the stack's certificate: %w", err)
	}
	for _, srv := range servers {
		dc := srv.spec.Datacenter
		out, err := regionctl(ctx, filepath.Join(bin, "regionctl"), servers[0].httpAddr(), "certs", "put", "--region", dc, TLSName, cert)
		if err != nil {
			return fmt.Errorf("putting the stack's certificate into %s: %w\n%s", dc, err, out)
		}
	}
	fmt.Fprintf(logw, "stackctl: certificate for %s and *.%s in every region's Consul\n", TLSName, TLSName)
	return nil
}

// waitEdgesTLS waits until every TLS edge serves the stack's certificate.
func (st State) waitEdgesTLS(ctx context.Context, edges []Spec) error {
	var cfg *tls.Config
	for _, s := range edges {
		if s.Edge.TLSPort == 0 {
			continue
		}
		if cfg == nil {
			var err error
			if cfg, err = st.TLSClientConfig(); err != nil {
				return err
			}
		}
		if err := proc.Poll(ctx, "edge "+s.Edge.Name+" to serve TLS", func(ctx context.Context) error {
			return tlsReady(ctx, cfg, *s.Edge)
		}); err != nil {
			return err
		}
	}
	return nil
}
