package edgeguard

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/grafana/sobek"
)

// ResultsDirEnv names the directory writeResult writes into (default
// loadtest/results, relative to the working directory).
const ResultsDirEnv = "EDGEGUARD_RESULTS"

// WriteResult is writeResult(name, text), for handleSummary(): it writes a
// file into the results directory and returns its path. Returning null
// from handleSummary keeps k6's own end-of-test summary on stdout, which a
// returned map would replace. name must be a plain file name.
func (mi *ModuleInstance) WriteResult(name, text string) (string, error) {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("writeResult: %q: want a plain file name", name)
	}
	dir := os.Getenv(ResultsDirEnv)
	if dir == "" {
		dir = filepath.Join("loadtest", "results")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("writeResult: %w", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("writeResult: %w", err)
	}
	return path, nil
}

// Print is print(text): text to k6's stdout as is (console.log goes
// through the logger, with its prefixes, to stderr).
func Print(text string) {
	fmt.Fprintln(os.Stdout, text)
}

// Mean is mean(name, fromMs, toMs): the mean of a series' values between
// two now() readings (0 = open); null when there are none.
func (mi *ModuleInstance) Mean(name string, fromMs, toMs float64) sobek.Value {
	pts := mi.values(name, fromMs, toMs)
	if len(pts) == 0 {
		return sobek.Null()
	}
	var sum float64
	for _, p := range pts {
		sum += p.v
	}
	return mi.vu.Runtime().ToValue(sum / float64(len(pts)))
}
