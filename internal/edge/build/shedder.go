package build

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Shedder is the load shedder with cfg's workers attached, the edges
// sharing the origin splitting adaptive.min_limit, and the settings in
// --shedder applied when given.
func Shedder(cfg config.Config, edges int, reg prometheus.Registerer, log *slog.Logger) (*shedder.Shedder, *shedder.Workers, error) {
	s, err := shedder.New(shedder.DefaultConfig(), reg)
	if err != nil {
		return nil, nil, err
	}
	s.SetEdges(edges)
	def := shedder.DefaultConfig()
	w := shedder.NewWorkers(cfg.Workers, def.QueueSize, def.QueueTimeout)
	s.AttachWorkers(w)
	if cfg.Shedder != "" {
		if err := LoadShedder(s, cfg.Shedder, log); err != nil {
			return nil, nil, err
		}
	}
	return s, w, nil
}

// ReloadShedder is LoadShedder again (SIGHUP), when there is a file: an
// invalid one is logged, and s keeps its settings.
func ReloadShedder(s *shedder.Shedder, path string, log *slog.Logger) {
	if path == "" {
		return
	}
	if err := LoadShedder(s, path, log); err != nil {
		log.Error("shedder reload refused; keeping the settings in force", "err", err)
	}
}

// StartShedder gives s back the settings the edge started with: the file
// at path, or the defaults without one.
func StartShedder(s *shedder.Shedder, path string, log *slog.Logger) error {
	if path != "" {
		return LoadShedder(s, path, log)
	}
	return s.Update(shedder.DefaultConfig())
}

// LoadShedder applies the shedder settings in the file at path; s keeps
// its settings when the file is invalid.
func LoadShedder(s *shedder.Shedder, path string, log *slog.Logger) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading shedder settings: %w", err)
	}
	scfg, err := shedder.ParseConfig(data)
	if err != nil {
		return fmt.Errorf("shedder settings %s: %w", path, err)
	}
	if err := s.Update(scfg); err != nil {
		return err
	}
	log.Info("shedder settings applied", "good", scfg.Good, "bad", scfg.Bad, "start_after", scfg.StartAfter, "full_after", scfg.FullAfter, "enabled", scfg.Enabled)
	return nil
}
