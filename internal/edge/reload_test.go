package edge

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// SIGHUP re-reads the rules and shedder files; an invalid file is refused and
// the settings in force stay.
func TestReloadFiles(t *testing.T) {
	shedFile := filepath.Join(t.TempDir(), "shedder.json")
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.6, "bad": 0.7}`), 0o600))
	r := startEdge(t, perIP, func(c *config.Config) { c.Shedder = shedFile })
	require.InDelta(t, 0.6, r.shed.Config().Good, 1e-9)
	v1 := r.rules.Load().Version()
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/"))

	require.NoError(t, os.WriteFile(r.cfg.Rules, []byte("version: 1\nrules:\n  - id: per-ip\n    key: [ip]\n    algorithm: sliding_log\n    limit: 5\n    window: 1m\n"), 0o600))
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.75, "bad": 0.9}`), 0o600))
	r.reloadFiles()
	v2 := r.rules.Load().Version()
	require.NotEqual(t, v1, v2)
	require.InDelta(t, 0.75, r.shed.Config().Good, 1e-9)
	require.Equal(t, 200, r.get(t, "/").StatusCode, "a larger limit applies at once (cached denials flushed)")

	require.NoError(t, os.WriteFile(r.cfg.Rules, []byte("version: 1\nrules:\n  - id: per-ip\n    key: [ip]\n    algorithm: sliding_log\n    limit: -1\n    window: 1m\n"), 0o600))
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.9, "bad": 0.8}`), 0o600))
	r.reloadFiles()
	require.Equal(t, v2, r.rules.Load().Version(), "invalid rules refused")
	require.InDelta(t, 0.75, r.shed.Config().Good, 1e-9, "invalid shedder settings refused")
	require.Contains(t, scrape(t, r), "edgeguard_edge_rules_rejected_total 1\n")
}
