package regionctl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// --help, of the program or of a command, goes to stdout and succeeds; an
// unknown global flag is one line on stderr with a pointer to --help.
func TestHelpOnStdoutUnknownFlagShort(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{{"--help"}, {"help"}, {"rules", "validate", "--help"}, {"regions", "status", "--help"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, ExitOK, Main(args, env, &stdout, &stderr), "%v", args)
		require.Contains(t, stdout.String(), "Usage:", "%v", args)
		require.Empty(t, stderr.String(), "%v", args)
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, ExitUsage, Main([]string{"--no-such-flag", "regions", "status"}, env, &stdout, &stderr))
	require.Empty(t, stdout.String())
	require.Equal(t, 1, strings.Count(stderr.String(), "\n"), stderr.String())
	require.Contains(t, stderr.String(), "flag provided but not defined: -no-such-flag (see regionctl --help)")
}
