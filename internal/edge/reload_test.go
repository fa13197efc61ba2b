package edge

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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

// Each file SIGHUP re-reads logs its own refusal (liverules, build,
// hostroute), with the message and the attributes an operator's alert
// matches; nothing is logged at error for a file that is not given.
func TestReloadRefusalsAreLogged(t *testing.T) {
	dir := t.TempDir()
	shedFile, hostsFile := filepath.Join(dir, "shedder.json"), filepath.Join(dir, "hosts.yaml")
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.6, "bad": 0.7}`), 0o600))
	origin := testOrigin(t)
	require.NoError(t, os.WriteFile(hostsFile, []byte(hostsTable(origin, origin, "")), 0o600))
	r, logs := startLoggedEdge(t, perIP, func(c *config.Config) { c.Shedder, c.Hosts = shedFile, hostsFile })

	// Each error line's message and attribute names (slog's text form:
	// key=value, a value with spaces quoted).
	attr := regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)
	errorLines := func() map[string][]string {
		got := map[string][]string{}
		for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
			var msg string
			var keys []string
			level := ""
			for _, m := range attr.FindAllStringSubmatch(l, -1) {
				switch m[1] {
				case "time":
				case "level":
					level = m[2]
				case "msg":
					msg, _ = strconv.Unquote(m[2])
				default:
					keys = append(keys, m[1])
				}
			}
			if level == "ERROR" {
				slices.Sort(keys)
				got[msg] = keys
			}
		}
		return got
	}
	r.reloadFiles()
	require.Empty(t, errorLines(), "valid files reload quietly")

	require.NoError(t, os.WriteFile(r.cfg.Rules, []byte("version: 1\nrules:\n  - id: x\n    limit: -1\n"), 0o600))
	require.NoError(t, os.WriteFile(shedFile, []byte(`{"good": 0.9, "bad": 0.8}`), 0o600))
	require.NoError(t, os.WriteFile(hostsFile, []byte(hostsTable(origin, origin, "  c.example: {pool: nowhere}\n")), 0o600))
	r.reloadFiles()
	require.Equal(t, map[string][]string{
		"rules reload refused; keeping the rules in force":      {"err", "version"},
		"shedder reload refused; keeping the settings in force": {"err"},
		"host table reload refused; keeping the table in force": {"err", "version"},
	}, errorLines())
}
