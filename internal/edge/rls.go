package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/rlslink"
	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// buildRLS builds the rate limit service, when --rls-listen is set
// (package rlslink).
func (e *Edge) buildRLS(reg prometheus.Registerer) error {
	s, err := rlslink.New(e.cfg.RLS, rlslink.Options{
		Limiter:      e.limiter,
		Nodes:        func() int { return int(e.nodesRegion.Load()) },
		KeySalt:      e.cfg.KeySalt,
		IPv6Prefix:   e.cfg.IPv6Prefix,
		ConsulPrefix: e.cfg.ConsulPrefix,
		Region:       e.cfg.Region,
		Log:          e.log,
	}, reg)
	if err != nil || s == nil {
		return err
	}
	e.closers = append(e.closers, s.Close)
	e.rls = s
	return nil
}

// RLSAddr is the rate limit service's bound address ("" when off).
func (e *Edge) RLSAddr() string {
	if e.rls == nil {
		return ""
	}
	return e.rls.Addr()
}

// rlsFromConsul says whether the rate limit service's documents come from
// Consul: --rls-listen and --consul without --rls-config-dir (a directory
// wins over Consul).
func (e *Edge) rlsFromConsul() bool { return e.rls != nil && e.rls.FromConsul() }

// applyConsulRLS loads the region's rate limit service documents from
// Consul (by key); an invalid set is refused, logged and counted
// (edgeguard_rls_config_loads_total{outcome="error"}), and the
// configuration in force stays. No document at all, once there was a
// configuration, is a missing document (missing.go): the configuration in
// force stays.
func (e *Edge) applyConsulRLS(prefix string, docs map[string][]byte) {
	if len(docs) == 0 && e.rls.Configured() {
		if e.consul.SetMissing(consullink.DocRLS, true) {
			e.log.Warn("rate limit service documents missing in consul; keeping the configuration in force", "prefix", prefix)
		}
		return
	}
	byKey := make(map[string][]byte, len(docs))
	for name, d := range docs {
		byKey[prefix+name] = d
	}
	if err := e.rls.LoadDocuments(byKey); err != nil {
		e.log.Error("rate limit service documents from consul refused; keeping the configuration in force", "err", err, "prefix", prefix)
		return
	}
	// SERVING from the first configuration on, unless draining: checked
	// again after, so a drain that began in between wins.
	if !e.draining.Load() {
		e.rls.SetServing(true)
		if e.draining.Load() {
			e.rls.SetServing(false)
		}
	}
	e.consul.SetMissing(consullink.DocRLS, false)
	e.log.Info("rate limit service documents from consul loaded", "documents", len(docs), "domains", e.rls.Domains())
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
		e.rls.Stop(ctx)
	}
}
