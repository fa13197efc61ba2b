package buildinfo

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	i := Get()
	require.Equal(t, runtime.Version(), i.GoVersion)
	require.Equal(t, "devel", i.Version, "a test binary is not stamped")
	require.True(t, strings.HasPrefix(i.String(), "devel (revision "), i.String())

	old := version
	t.Cleanup(func() { version = old })
	version = "v1.2.3"
	require.Equal(t, "v1.2.3", Get().Version, "the stamped version wins")
}
