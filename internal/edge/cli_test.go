package edge

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// --help goes to stdout and succeeds; an unknown flag is one line on
// stderr naming it, and a pointer to --help, not the whole list of flags;
// both for the edge and for edge check.
func TestCommandLineHelpAndUnknownFlag(t *testing.T) {
	run := map[string]func(args []string, stdout, stderr *bytes.Buffer) int{
		"edge": func(args []string, stdout, stderr *bytes.Buffer) int {
			_, code, ok := ParseCommandLine(args, nil, stdout, stderr)
			if ok {
				return -1
			}
			return code
		},
		"edge check": func(args []string, stdout, stderr *bytes.Buffer) int {
			return Check(args, nil, stdout, stderr)
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
	_, code, ok := ParseCommandLine([]string{"--redis-mode", "cluster", "--demo-origin"}, nil, &stdout, &stderr)
	require.False(t, ok)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), "redis-mode: cluster needs --redis")
	cfg, _, ok := ParseCommandLine([]string{"--redis-autopipeline=true", "--demo-origin"}, nil, &stdout, &stderr)
	require.True(t, ok, "a setting at its default value without --redis: %s", stderr.String())
	require.True(t, cfg.RedisAutopipeline)
}
