package edge

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// rlsService is the edge's rate limit service, when --rls-listen is set.
type rlsService struct {
	srv  *rls.Server
	grpc *rls.GRPC
	ln   net.Listener
}

// buildRLS loads the configuration (refusing to start on an invalid one)
// and binds the listener.
func (e *Edge) buildRLS(reg prometheus.Registerer) error {
	c := e.cfg.RLS
	if c.Listen == "" {
		return nil
	}
	headers, _ := rls.ParseHeaders(c.Headers) // validated
	names, _ := rls.ParseNames(c.HeaderNames)
	srv, err := rls.New(rls.Options{
		Limiter:       e.limiter,
		Nodes:         func() int { return int(e.nodesRegion.Load()) },
		TrustOverride: rls.TrustFrom(c.OverrideFrom),
		Shadow:        c.Shadow,
		Headers:       headers,
		Names:         names,
		// Hashed names use the key salt: the same on every edge of the
		// region, so a limit has one name whichever edge answers.
		NameSalt: nameSalt(e.cfg.KeySalt),
	}, reg, e.log)
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if c.ConfigDir != "" {
		if err := srv.Reload(c.ConfigDir, c.MergeDomains); err != nil {
			return fmt.Errorf("loading the rate limit service configuration: %w", err)
		}
	} // else Consul's documents, once watched: until then calls are UNAVAILABLE
	var creds credentials.TransportCredentials
	if c.TLSCert != "" {
		tc, err := rls.TLSConfig(c.TLSCert, c.TLSKey, c.ClientCA)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(tc)
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s (rate limit service): %w", c.Listen, err)
	}
	e.closers = append(e.closers, func() { _ = ln.Close() })
	// The per-address cap of the proxy port, with counts of its own (the
	// callers are Envoys, not the public) and no exemption; a refused
	// connection is closed without a word (gRPC clients read no text).
	served := listen.Capped(ln, listen.NewConnCounts(c.MaxConnsPerIP, e.cfg.IPv6Prefix, nil, srv.RefusedConns()), nil)
	e.rls = &rlsService{srv: srv, grpc: rls.NewGRPC(srv, rls.GRPCOptions{Creds: creds, MaxStreams: uint32(c.MaxStreams), Reflection: c.Reflection}), ln: served}
	if c.ConfigDir != "" {
		e.log.Info("rate limit service configured", "domains", len(srv.Config().Domains()), "dir", c.ConfigDir)
	} else {
		e.log.Info("rate limit service configured; documents from consul", "prefix", region.NewLayout(e.cfg.ConsulPrefix).RLS(e.cfg.Region))
	}
	return nil
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

// RLSAddr is the rate limit service's bound address ("" when off).
func (e *Edge) RLSAddr() string {
	if e.rls == nil {
		return ""
	}
	return e.rls.ln.Addr().String()
}

func (e *Edge) reloadRLS() {
	if e.rls == nil || e.cfg.RLS.ConfigDir == "" {
		return // none, or watched in Consul
	}
	if err := e.rls.srv.Reload(e.cfg.RLS.ConfigDir, e.cfg.RLS.MergeDomains); err != nil {
		e.log.Error("rate limit service configuration reload refused; keeping the one in force", "err", err)
		return
	}
	e.log.Info("rate limit service configuration reloaded", "domains", len(e.rls.srv.Config().Domains()))
}

// rlsFromConsul says whether the rate limit service's documents come from
// Consul: --rls-listen and --consul without --rls-config-dir (a directory
// wins over Consul).
func (e *Edge) rlsFromConsul() bool { return e.rls != nil && e.cfg.RLS.ConfigDir == "" }

// applyConsulRLS loads the region's rate limit service documents from
// Consul (by key); an invalid set is refused, logged and counted
// (edgeguard_rls_config_loads_total{outcome="error"}), and the
// configuration in force stays. No document at all, once there was a
// configuration, is a missing document (missing.go): the configuration in
// force stays.
func (e *Edge) applyConsulRLS(prefix string, docs map[string][]byte) {
	if len(docs) == 0 && e.rls.srv.Config() != nil {
		if e.consul.SetMissing(consullink.DocRLS, true) {
			e.log.Warn("rate limit service documents missing in consul; keeping the configuration in force", "prefix", prefix)
		}
		return
	}
	byKey := make(map[string][]byte, len(docs))
	for name, d := range docs {
		byKey[prefix+name] = d
	}
	if err := e.rls.srv.LoadDocuments(byKey, e.cfg.RLS.MergeDomains); err != nil {
		e.log.Error("rate limit service documents from consul refused; keeping the configuration in force", "err", err, "prefix", prefix)
		return
	}
	// SERVING from the first configuration on, unless draining: checked
	// again after, so a drain that began in between wins.
	if !e.draining.Load() {
		e.rls.grpc.SetServing(true)
		if e.draining.Load() {
			e.rls.grpc.SetServing(false)
		}
	}
	e.consul.SetMissing(consullink.DocRLS, false)
	e.log.Info("rate limit service documents from consul loaded", "documents", len(docs), "domains", len(e.rls.srv.Config().Domains()))
	// Registered again: a service left critical (no documents) long
	// enough for the agent to drop it comes back with its first ones.
	e.consul.RulesChanged()
	if path := e.rlsCache(); path != "" {
		data, err := json.Marshal(docs)
		if err == nil {
			err = consullink.WriteFileAtomic(path, data)
		}
		if err != nil {
			e.log.Warn("could not cache the rate limit service documents", "path", path, "err", err)
		}
	}
}

// rlsCache is the file beside the rules cache keeping the last documents
// from Consul that loaded ("" without a rules cache).
func (e *Edge) rlsCache() string { return e.consul.Beside(".rls.json") }

// loadRLSCache serves the cached documents: an edge started while Consul
// is unreachable answers with what its region last pushed.
func (e *Edge) loadRLSCache(prefix string) error {
	path := e.rlsCache()
	if path == "" {
		return errors.New("no rules cache")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var docs map[string][]byte
	if err := strictjson.Unmarshal(data, &docs); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	e.applyConsulRLS(prefix, docs)
	return nil
}

func (e *Edge) stopRLS(ctx context.Context) {
	if e.rls != nil {
		e.rls.grpc.Stop(ctx)
	}
}
