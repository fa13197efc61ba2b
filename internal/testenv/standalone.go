package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/servers"
)

// StandaloneOptions configures StartStandalone.
type StandaloneOptions struct {
	// Password, if set, is required from clients (requirepass), for testing
	// authentication failures.
	Password string
	// TLS, if set, adds a TLS port (Standalone.TLSAddr) serving this
	// certificate; clients are not asked for one.
	TLS *Leaf
}

// Standalone is a single redis-server.
type Standalone struct {
	Addr     string // "127.0.0.1:port"
	TLSAddr  string // the TLS port's "127.0.0.1:port", with StandaloneOptions.TLS
	Password string // as in StandaloneOptions

	d *deployment
}

// StartStandalone starts one redis-server and returns once it serves.
func StartStandalone(opts StandaloneOptions) (*Standalone, error) {
	bin, err := servers.Lookup("redis-server")
	if err != nil {
		return nil, err
	}
	d, err := newDeployment("standalone")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting standalone: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	s := spec{name: "redis", bin: bin}
	var tlsConf string
	if opts.TLS != nil {
		cert, key := filepath.Join(d.dir, "tls-cert.pem"), filepath.Join(d.dir, "tls-key.pem")
		if err := errors.Join(os.WriteFile(cert, opts.TLS.CertPEM, 0o600), os.WriteFile(key, opts.TLS.KeyPEM, 0o600)); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("testenv: starting standalone: %w", err)
		}
		s.extraPorts = 1
		tlsConf = "tls-cert-file " + servers.Quote(cert) + "\ntls-key-file " + servers.Quote(key) + "\ntls-auth-clients no\n"
	}
	var tlsPort int
	s.config = func(ports []int) string {
		conf := tlsConf
		if opts.TLS != nil {
			tlsPort = ports[1]
			conf += fmt.Sprintf("tls-port %d\n", ports[1])
		}
		if opts.Password != "" {
			conf += "requirepass " + servers.Quote(opts.Password) + "\n"
		}
		return conf
	}
	p, err := d.spawn(ctx, s)
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting standalone: %w", err)
	}
	st := &Standalone{Addr: p.addr, Password: opts.Password, d: d}
	if opts.TLS != nil {
		st.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	}
	return st, nil
}

// URL returns a go-redis URL for the server, including the password if one
// is set.
func (s *Standalone) URL() string {
	u := url.URL{Scheme: "redis", Host: s.Addr}
	if s.Password != "" {
		u.User = url.UserPassword("", s.Password)
	}
	return u.String()
}

// Close kills the server and removes its files. It is idempotent.
func (s *Standalone) Close() error {
	return s.d.Close()
}

// ComeBackEmpty makes the server what a replica promoted in its place with
// none of its data would be: a new replication id (it serves as a replica
// of nothing for a moment, then as a master again) and no keys. A server
// merely emptied (FLUSHALL) keeps its identity, and a store that kept its
// identity kept its state (lua.Identity). Call it while no client writes.
func (s *Standalone) ComeBackEmpty(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.Password})
	defer func() { _ = c.Close() }()
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err(); err != nil { // port 1: never reached
		return err
	}
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return err
	}
	return c.FlushAll(ctx).Err()
}
