package rlslink

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// Consul is what the service needs of the Consul link's document when its
// documents come from Consul (FromConsul; consullink.Doc).
type Consul interface {
	// Missing records the region's documents as missing or not, and
	// reports whether that changed.
	Missing(missing bool) bool
	// Changed registers the edge again: a service left critical (no
	// documents) long enough for the agent to drop it comes back.
	Changed()
	Cache() string          // the file keeping the last documents that loaded ("" none)
	Keep(data []byte) error // replaces Cache whole
}

// ApplyConsul loads the region's documents from Consul (by key, under
// prefix); an invalid set is refused, logged and counted
// (edgeguard_rls_config_loads_total{outcome="error"}), and the
// configuration in force stays. No document at all, once there was a
// configuration, is a missing document: the configuration in force stays.
func (s *Service) ApplyConsul(prefix string, docs map[string][]byte, c Consul) {
	if len(docs) == 0 && s.Configured() {
		if c.Missing(true) {
			s.log.Warn("rate limit service documents missing in consul; keeping the configuration in force", "prefix", prefix)
		}
		return
	}
	byKey := make(map[string][]byte, len(docs))
	for name, d := range docs {
		byKey[prefix+name] = d
	}
	if err := s.LoadDocuments(byKey); err != nil {
		s.log.Error("rate limit service documents from consul refused; keeping the configuration in force", "err", err, "prefix", prefix)
		return
	}
	// SERVING from the first configuration on, unless draining: checked
	// again after, so a drain that began in between wins.
	if !s.draining() {
		s.SetServing(true)
		if s.draining() {
			s.SetServing(false)
		}
	}
	c.Missing(false)
	s.log.Info("rate limit service documents from consul loaded", "documents", len(docs), "domains", s.Domains())
	c.Changed()
	if path := c.Cache(); path != "" {
		data, err := json.Marshal(docs)
		if err == nil {
			err = c.Keep(data)
		}
		if err != nil {
			s.log.Warn("could not cache the rate limit service documents", "path", path, "err", err)
		}
	}
}

// LoadCache serves the cached documents: an edge started while Consul is
// unreachable answers with what its region last pushed.
func (s *Service) LoadCache(prefix string, c Consul) error {
	path := c.Cache()
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
	s.ApplyConsul(prefix, docs, c)
	return nil
}
