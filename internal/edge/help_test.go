package edge

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// TestHelpShowsEveryDefault: --help and the flag reference give every
// flag's default, the empty and false ones included.
func TestHelpShowsEveryDefault(t *testing.T) {
	var out, errOut bytes.Buffer
	_, code, ok := config.ParseCommandLine([]string{"--help"}, nil, &out, &errOut)
	require.False(t, ok)
	require.Zero(t, code)
	help := out.String()
	ref := config.Reference()
	n := 0
	for _, row := range strings.Split(ref, "\n") {
		if !strings.HasPrefix(row, "| `--") {
			continue
		}
		n++
		cells := strings.Split(row, " | ")
		name := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`-")
		i := strings.Index(help, "\n  -"+name+" ")
		if i < 0 {
			i = strings.Index(help, "\n  -"+name+"\n")
		}
		require.GreaterOrEqual(t, i, 0, "--%s in --help", name)
		block := help[i+1:]
		if j := strings.Index(block[1:], "\n  -"); j >= 0 {
			block = block[:j+1]
		}
		require.Contains(t, block, "(default: ", "--%s in --help", name)
		require.NotEqual(t, "", strings.Trim(cells[2], "`"), "--%s in the reference", name)
	}
	require.Greater(t, n, 50)
	require.Contains(t, help, "-rls-headers string\n    \t")
	require.Contains(t, help, `(default: "off")`)
	require.Contains(t, help, "(default: false)")
	require.Contains(t, help, "(default: 512 × cores)")
	require.Contains(t, ref, "| `--rls-shadow` | `EDGEGUARD_RLS_SHADOW` | `false` |")
	require.Contains(t, ref, "| `--access-log` | `EDGEGUARD_ACCESS_LOG` | `\"\"` |")
}
