package edge

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// TestHelpShowsEveryDefault: --help and the flag reference give every
// flag's default, the empty and false ones included.
func TestHelpShowsEveryDefault(t *testing.T) {
	var out, errOut bytes.Buffer
	_, code, ok := ParseCommandLine([]string{"--help"}, nil, &out, &errOut)
	require.False(t, ok)
	require.Zero(t, code)
	help := out.String()
	ref := flagsReference()
	n := 0
	config.Flags().VisitAll(func(f *flag.Flag) {
		n++
		i := strings.Index(help, "\n  -"+f.Name+" ")
		if i < 0 {
			i = strings.Index(help, "\n  -"+f.Name+"\n")
		}
		require.GreaterOrEqual(t, i, 0, "--%s in --help", f.Name)
		block := help[i+1:]
		if j := strings.Index(block[1:], "\n  -"); j >= 0 {
			block = block[:j+1]
		}
		require.Contains(t, block, "(default: ", "--%s in --help", f.Name)
		row := ref[strings.Index(ref, "| `--"+f.Name+"` |"):]
		cells := strings.Split(row[:strings.IndexByte(row, '\n')], " | ")
		require.NotEqual(t, "", strings.Trim(cells[2], "`"), "--%s in the reference", f.Name)
	})
	require.Greater(t, n, 50)
	require.Contains(t, help, "-rls-headers string\n    \t")
	require.Contains(t, help, `(default: "off")`)
	require.Contains(t, help, "(default: false)")
	require.Contains(t, help, "(default: 512 × cores)")
	require.Contains(t, ref, "| `--rls-shadow` | `EDGEGUARD_RLS_SHADOW` | `false` |")
	require.Contains(t, ref, "| `--access-log` | `EDGEGUARD_ACCESS_LOG` | `\"\"` |")
}
