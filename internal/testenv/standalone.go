package testenv

import (
	"context"
	"fmt"
	"net/url"

	"github.com/edgeguard/edgeguard/internal/servers"
)

// StandaloneOptions configures StartStandalone.
type StandaloneOptions struct {
	// Password, if set, is required from clients (requirepass), for testing
	// authentication failures.
	Password string
}

// Standalone is a single redis-server.
type Standalone struct {
	Addr     string // "127.0.0.1:port"
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

	p, err := d.spawn(ctx, spec{
		name: "redis",
		bin:  bin,
		config: func([]int) string {
			if opts.Password == "" {
				return ""
			}
			return "requirepass " + servers.Quote(opts.Password)
		},
	})
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting standalone: %w", err)
	}
	return &Standalone{Addr: p.addr, Password: opts.Password, d: d}, nil
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
