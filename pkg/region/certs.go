package region

import (
	"context"
	"errors"
	"maps"
	"strings"

	"github.com/hashicorp/consul/api"
)

// TLS certificates the region's edges serve, one key per certificate so
// Terraform or regionctl manage each on its own:
//
//	certs/<region>/<name>     chain and private key, PEM
//
// Names are what an operator calls the certificate ("shop", "wildcard-
// example-com"): one path segment of letters, digits, '.', '-' and '_'. An
// edge serves them beside its --tls-cert-dir.
func (l Layout) Certs(region string) string { return l.Prefix + "certs/" + region + "/" }

// ErrBadCertName is a certificate name that cannot be a key.
var ErrBadCertName = errors.New("a certificate name is 1 to 128 letters, digits, '.', '-' or '_'")

// ValidCertName reports whether name may name a certificate.
func ValidCertName(name string) bool {
	if name == "" || len(name) > 128 || name == "." || name == ".." {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// StoredCert is one certificate key.
type StoredCert struct {
	Name        string
	PEM         []byte
	ModifyIndex uint64
}

// certsOf picks the certificates out of a listing of prefix.
func certsOf(pairs api.KVPairs, prefix string) []StoredCert {
	var out []StoredCert
	for _, p := range pairs {
		name := strings.TrimPrefix(p.Key, prefix)
		if !ValidCertName(name) {
			continue
		}
		out = append(out, StoredCert{Name: name, PEM: p.Value, ModifyIndex: p.ModifyIndex})
	}
	return out
}

// Certs lists the region's certificates, sorted by name.
func (c *Client) Certs(ctx context.Context, region string) ([]StoredCert, error) {
	prefix := c.layout.Certs(region)
	pairs, meta, err := c.api.KV().List(prefix, (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, classifyIn(region, "reading certificates of "+region, err)
	}
	if err := filtered("reading certificates of "+region, meta); err != nil {
		return nil, err
	}
	return certsOf(pairs, prefix), nil
}

// PutCert writes a certificate (the caller validated it).
func (c *Client) PutCert(ctx context.Context, region, name string, pem []byte) error {
	if !ValidCertName(name) {
		return ErrBadCertName
	}
	_, err := c.api.KV().Put(&api.KVPair{Key: c.layout.Certs(region) + name, Value: pem}, (&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	return classifyIn(region, "writing certificate "+name+" in "+region, err)
}

// DeleteCert removes a certificate; ErrNotFound when there is none of that
// name.
func (c *Client) DeleteCert(ctx context.Context, region, name string) error {
	if !ValidCertName(name) {
		return ErrBadCertName
	}
	key := c.layout.Certs(region) + name
	_, index, err := c.Get(ctx, region, key)
	if err != nil {
		return err
	}
	if index == 0 {
		return ErrNotFound
	}
	ok, _, err := c.api.KV().DeleteCAS(&api.KVPair{Key: key, ModifyIndex: index}, (&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return classifyIn(region, "deleting certificate "+name+" in "+region, err)
	}
	if !ok {
		return ErrConflict
	}
	return nil
}

// WatchCerts calls fn with the region's certificates (name → PEM) now and
// after every change, with blocking queries in the local datacenter, until
// ctx is done; fn runs only when a certificate was added, changed or
// removed. Errors go to onErr and are retried with backoff.
func (c *Client) WatchCerts(ctx context.Context, region string, fn func(map[string][]byte), onErr func(error)) {
	prefix := c.layout.Certs(region)
	var last map[string]uint64
	c.watch(ctx, prefix, onErr, func(pairs api.KVPairs) error {
		certs := certsOf(pairs, prefix)
		indexes := make(map[string]uint64, len(certs))
		byName := make(map[string][]byte, len(certs))
		for _, s := range certs {
			indexes[s.Name], byName[s.Name] = s.ModifyIndex, s.PEM
		}
		if last != nil && maps.Equal(last, indexes) {
			return nil
		}
		last = indexes
		fn(byName)
		return nil
	})
}
