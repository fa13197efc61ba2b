// Package rlslink is the edge's rate limit service (internal/rls) when
// --rls-listen is set: its configuration (a directory, re-read on SIGHUP,
// or the region's documents in Consul, handed in by the wiring), its gRPC
// listener with the per-address cap, and its health through a drain.
package rlslink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Service is the edge's rate limit service.
type Service struct {
	cfg  config.RLSConfig
	log  *slog.Logger
	srv  *rls.Server
	grpc *rls.GRPC
	raw  net.Listener // as bound
	ln   net.Listener // raw, capped per client address
	// draining says whether the edge is draining: the service then stays
	// NOT_SERVING whatever loads.
	draining func() bool
}

// Options is what the service takes from the rest of the edge.
type Options struct {
	Limiter *limiter.Limiter
	// Nodes is the region's edge count, for the local fallback's share.
	Nodes      func() int
	KeySalt    string
	IPv6Prefix int
	// ConsulPrefix and Region name the Consul documents in the log.
	ConsulPrefix, Region string
	Log                  *slog.Logger
	// Bind opens the listener on an address (nil: net.Listen), so the
	// edge can hand it an inherited socket.
	Bind func(addr string) (net.Listener, error)
	// Draining says whether the edge is draining (nil: never): documents
	// loading from Consul then leave the service NOT_SERVING.
	Draining func() bool
}

// Open is New for the edge's settings (--rls-*, --key-salt,
// --ipv6-prefix; the Consul prefix and the region for the log).
func Open(cfg config.Config, o Options, reg prometheus.Registerer) (*Service, error) {
	o.KeySalt, o.IPv6Prefix, o.ConsulPrefix, o.Region = cfg.KeySalt, cfg.IPv6Prefix, cfg.ConsulPrefix, cfg.Region
	return New(cfg.RLS, o, reg)
}

// New loads the configuration (refusing to start on an invalid one) and
// binds the listener; nil without c.Listen.
func New(c config.RLSConfig, o Options, reg prometheus.Registerer) (*Service, error) {
	if c.Listen == "" {
		return nil, nil
	}
	headers, _ := rls.ParseHeaders(c.Headers) // validated
	names, _ := rls.ParseNames(c.HeaderNames)
	srv, err := rls.New(rls.Options{
		Limiter:       o.Limiter,
		Nodes:         o.Nodes,
		TrustOverride: rls.TrustFrom(c.OverrideFrom),
		Shadow:        c.Shadow,
		Headers:       headers,
		Names:         names,
		// Hashed names use the key salt: the same on every edge of the
		// region, so a limit has one name whichever edge answers.
		NameSalt: nameSalt(o.KeySalt),
	}, reg, o.Log)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	if c.ConfigDir != "" {
		if err := srv.Reload(c.ConfigDir, c.MergeDomains, c.Match()...); err != nil {
			return nil, fmt.Errorf("loading the rate limit service configuration: %w", err)
		}
	} // else Consul's documents, once watched: until then calls are UNAVAILABLE
	var creds credentials.TransportCredentials
	if c.TLSCert != "" {
		tc, err := rls.TLSConfig(c.TLSCert, c.TLSKey, c.ClientCA)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	bind := o.Bind
	if bind == nil {
		bind = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	}
	ln, err := bind(c.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening on %s (rate limit service): %w", c.Listen, err)
	}
	// The per-address cap of the proxy port, with counts of its own (the
	// callers are Envoys, not the public) and no exemption; a refused
	// connection is closed without a word (gRPC clients read no text).
	served := listen.Capped(ln, listen.NewConnCounts(c.MaxConnsPerIP, o.IPv6Prefix, nil, srv.RefusedConns()), nil)
	s := &Service{cfg: c, log: o.Log, srv: srv, grpc: rls.NewGRPC(srv, rls.GRPCOptions{Creds: creds, MaxStreams: uint32(c.MaxStreams), Reflection: c.Reflection}), raw: ln, ln: served, draining: o.Draining}
	if s.draining == nil {
		s.draining = func() bool { return false }
	}
	if c.ConfigDir != "" {
		o.Log.Info("rate limit service configured", "domains", len(srv.Config().Domains()), "dir", c.ConfigDir)
	} else {
		o.Log.Info("rate limit service configured; documents from consul", "prefix", region.NewLayout(o.ConsulPrefix).RLS(o.Region))
	}
	return s, nil
}

// nameSalt derives the hashed names' salt from the key salt (nil without
// one: the service draws a salt of its own), so a header name never helps
// anyone guess the salt of the Redis keys.
func nameSalt(keySalt string) []byte {
	if keySalt == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte(keySalt))
	m.Write([]byte("edgeguard rls header names"))
	return m.Sum(nil)
}

// Addr is the service's bound address ("" for a nil Service: none on
// --rls-listen).
func (s *Service) Addr() string {
	if s == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close closes the listener (the edge's closers, when it fails to start).
func (s *Service) Close() {
	if s != nil {
		_ = s.raw.Close()
	}
}

// Reload re-reads the configuration directory (SIGHUP); an invalid set
// keeps the one in force. Documents from Consul are watched instead; a
// nil Service has nothing to reload.
func (s *Service) Reload() {
	if s == nil || s.cfg.ConfigDir == "" {
		return // watched in Consul
	}
	if err := s.srv.Reload(s.cfg.ConfigDir, s.cfg.MergeDomains, s.cfg.Match()...); err != nil {
		s.log.Error("rate limit service configuration reload refused; keeping the one in force", "err", err)
		return
	}
	s.log.Info("rate limit service configuration reloaded", "domains", len(s.srv.Config().Domains()))
}

// FromConsul says whether the documents come from Consul: no
// --rls-config-dir (a directory wins over Consul); false for a nil
// Service.
func (s *Service) FromConsul() bool { return s != nil && s.cfg.ConfigDir == "" }

// Configured says whether a configuration is in force.
func (s *Service) Configured() bool { return s.srv.Config() != nil }

// Domains is the number of domains the configuration in force has.
func (s *Service) Domains() int { return len(s.srv.Config().Domains()) }

// LoadDocuments puts documents by key in force; an invalid set is refused
// and the configuration in force stays.
func (s *Service) LoadDocuments(byKey map[string][]byte) error {
	return s.srv.LoadDocuments(byKey, s.cfg.MergeDomains, s.cfg.Match()...)
}

// SetServing sets the gRPC health status (nothing for a nil Service).
func (s *Service) SetServing(ok bool) {
	if s != nil {
		s.grpc.SetServing(ok)
	}
}

// Serve answers calls until Stop.
func (s *Service) Serve() error { return s.grpc.Serve(s.ln) }

// Stop says NOT_SERVING at once, then lets the calls in flight finish
// (until ctx is done).
func (s *Service) Stop(ctx context.Context) { s.grpc.Stop(ctx) }
