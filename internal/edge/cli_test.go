package edge

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/stretchr/testify/require"
)

// --help goes to stdout and succeeds; an unknown flag is one line on
// stderr naming it, and a pointer to --help, not the whole list of flags;
// both for the edge and for edge check.
func TestCommandLineHelpAndUnknownFlag(t *testing.T) {
	run := map[string]func(args []string, stdout, stderr *bytes.Buffer) int{
		"edge": func(args []string, stdout, stderr *bytes.Buffer) int {
			_, code, ok := config.ParseCommandLine(args, nil, stdout, stderr)
			if ok {
				return -1
			}
			return code
		},
		"edge check": func(args []string, stdout, stderr *bytes.Buffer) int {
			return check.Run(args, nil, stdout, stderr)
		},
	}
	for prog, run := range run {
		t.Run(prog, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Zero(t, run([]string{"--help"}, &stdout, &stderr))
			require.Contains(t, stdout.String(), "Usage: edge [flags]")
			require.Contains(t, stdout.String(), "-redis-autopipeline")
			require.Empty(t, stderr.String())

			stdout.Reset()
			stderr.Reset()
			require.Equal(t, 2, run([]string{"--no-such-flag", "--demo-origin"}, &stdout, &stderr))
			require.Empty(t, stdout.String())
			require.Equal(t, prog+": flag provided but not defined: -no-such-flag\nRun '"+prog+" --help' for the list of flags.\n", stderr.String())

			stdout.Reset()
			stderr.Reset()
			require.Equal(t, 2, run([]string{"--redis-timeout"}, &stdout, &stderr), "a flag without its value")
			require.LessOrEqual(t, strings.Count(stderr.String(), "\n"), 2, stderr.String())
		})
	}
}

// Refused settings are reported on stderr with exit 2; good ones start.
func TestCommandLineSettings(t *testing.T) {
	var stdout, stderr bytes.Buffer
	_, code, ok := config.ParseCommandLine([]string{"--redis-mode", "cluster", "--demo-origin"}, nil, &stdout, &stderr)
	require.False(t, ok)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), "redis-mode: cluster needs --redis")
	cfg, _, ok := config.ParseCommandLine([]string{"--redis-autopipeline=true", "--demo-origin"}, nil, &stdout, &stderr)
	require.True(t, ok, "a setting at its default value without --redis: %s", stderr.String())
	require.True(t, cfg.RedisAutopipeline)
}

// edge check validates the settings, the rules and the shedder settings
// offline and reports every problem in one pass.
func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	good := []string{"--demo-origin", "--rules", write("rules.yaml", perIP), "--shedder", write("shedder.yaml", "good: 0.6\n")}
	var out bytes.Buffer
	require.Equal(t, 0, check.Run(good, nil, &out, io.Discard), out.String())
	require.Contains(t, out.String(), "ok: ")

	out.Reset()
	bad := []string{"--origin-header-timeout", "0s", "--demo-origin",
		"--rules", write("bad-rules.yaml", "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: -1, window: 1m}\n"),
		"--shedder", write("bad-shedder.yaml", "goood: 0.5\n")}
	require.Equal(t, 1, check.Run(bad, nil, &out, io.Discard))
	for _, want := range []string{"origin-header-timeout: must be > 0", `unknown field "goood"`} {
		require.Contains(t, out.String(), want)
	}
	// Rule problems are printed as pkg/rules words them, after the file
	// and line, one per line, as "regionctl rules validate" prints them.
	rulesFile := bad[4]
	require.Contains(t, strings.Split(out.String(), "\n"), rulesFile+`:3: rule "a": limit: must be > 0 (got -1)`)

	out.Reset()
	twoBad := write("two-bad.yaml", "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 0s}\n  - {id: b, key: [ip], algorithm: sliding_log, limit: 1, window: 1m, burst: 3}\n")
	require.Equal(t, 1, check.Run([]string{"--demo-origin", "--rules", twoBad}, nil, &out, io.Discard))
	require.Equal(t, twoBad+`:3: rule "a": window: must be >= 1ms for fixed_window (got 0s)`+"\n"+
		twoBad+`:4: rule "b": burst: only valid for leaky_bucket, token_bucket (algorithm is sliding_log)`+"\n", out.String())
	// The host table: checked as regionctl hosts validate checks it.
	out.Reset()
	hostsGood := write("hosts.yaml", "version: 1\npools:\n  a: {urls: [\"http://10.0.0.1:80\"]}\nhosts:\n  a.example: {pool: a}\n")
	require.Equal(t, 0, check.Run([]string{"--demo-origin", "--hosts", hostsGood}, nil, &out, io.Discard), out.String())
	require.Contains(t, out.String(), "hosts "+hostsGood+" (hosts 1, pools 1)")
	out.Reset()
	hostsBad := write("hosts-bad.yaml", "version: 1\nhosts:\n  a.example: {pool: nowhere}\n")
	require.Equal(t, 1, check.Run([]string{"--demo-origin", "--hosts", hostsBad}, nil, &out, io.Discard))
	require.Contains(t, out.String(), hostsBad+":3:")
}
