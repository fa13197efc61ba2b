package build

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Shed is the load shedder with its workers, and the settings the edge
// started with: the file at --shedder, or the defaults without one.
type Shed struct {
	*shedder.Shedder
	Workers *shedder.Workers
	file    string
	log     *slog.Logger
}

// Shedder is the load shedder with cfg's workers attached, the edges
// sharing the origin splitting adaptive.min_limit, and the settings in
// --shedder applied when given.
func Shedder(cfg config.Config, edges int, reg prometheus.Registerer, log *slog.Logger) (*Shed, error) {
	s, err := shedder.New(shedder.DefaultConfig(), reg)
	if err != nil {
		return nil, err
	}
	s.SetEdges(edges)
	def := shedder.DefaultConfig()
	w := shedder.NewWorkers(cfg.Workers, def.QueueSize, def.QueueTimeout)
	s.AttachWorkers(w)
	if cfg.Shedder != "" {
		if err := loadShedder(s, cfg.Shedder, log); err != nil {
			return nil, err
		}
	}
	return &Shed{Shedder: s, Workers: w, file: cfg.Shedder, log: log}, nil
}

// Start gives the shedder back the settings the edge started with.
func (s *Shed) Start() error { return startShedder(s.Shedder, s.file, s.log) }

// Reload reads the file again (SIGHUP); an invalid one is logged, and the
// settings in force stay.
func (s *Shed) Reload() { reloadShedder(s.Shedder, s.file, s.log) }

// Sample samples the workers' utilization every 50 ms until ctx is done.
func (s *Shed) Sample(ctx context.Context) {
	_ = s.Run(ctx, 50*time.Millisecond, s.Workers.Utilization)
}

// reloadShedder is loadShedder again (SIGHUP), when there is a file: an
// invalid one is logged, and s keeps its settings.
func reloadShedder(s *shedder.Shedder, path string, log *slog.Logger) {
	if path == "" {
		return
	}
	if err := loadShedder(s, path, log); err != nil {
		log.Error("shedder reload refused; keeping the settings in force", "err", err)
	}
}

// startShedder gives s back the settings the edge started with: the file
// at path, or the defaults without one.
func startShedder(s *shedder.Shedder, path string, log *slog.Logger) error {
	if path != "" {
		return loadShedder(s, path, log)
	}
	return s.Update(shedder.DefaultConfig())
}

// loadShedder applies the shedder settings in the file at path; s keeps
// its settings when the file is invalid.
func loadShedder(s *shedder.Shedder, path string, log *slog.Logger) error {
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
