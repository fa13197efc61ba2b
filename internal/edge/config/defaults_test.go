package config

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A setting given its default value never errors, whichever way it is
// given: on the command line, in the environment or in the config file
// (--redis-autopipeline=true without --redis, --redis-mode=standalone, …).
func TestSettingAtItsDefaultNeverErrors(t *testing.T) {
	base := []string{"--origin", "http://127.0.0.1:1"}
	c := DefaultConfig()
	fs := newFlagSet(&c, &bytes.Buffer{})
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" { // names a file, tested below
			return
		}
		n++
		t.Run(f.Name, func(t *testing.T) {
			_, err := ParseFlags(append([]string{"--" + f.Name + "=" + f.DefValue}, base...), env(nil), &bytes.Buffer{})
			require.NoError(t, err, "--%s=%s", f.Name, f.DefValue)
			if f.DefValue != "" { // an empty variable is no setting
				_, err = ParseFlags(base, env(map[string]string{EnvName(f.Name): f.DefValue}), &bytes.Buffer{})
				require.NoError(t, err, "%s=%s", EnvName(f.Name), f.DefValue)
				file := filepath.Join(t.TempDir(), "edge.yaml")
				require.NoError(t, os.WriteFile(file, []byte(f.Name+": '"+f.DefValue+"'\n"), 0o600))
				_, err = ParseFlags(append([]string{"--config", file}, base...), env(nil), &bytes.Buffer{})
				require.NoError(t, err, "%s: %s in the config file", f.Name, f.DefValue)
			}
		})
	})
	require.Greater(t, n, 40, "every setting was tried")
}
