package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStartRefusals: a node without an origin, or using Redis without a key
// salt, refuses to start and says what is missing.
func TestStartRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"no origin":          {nil, "origin: required"},
		"redis without salt": {[]string{"--origin", "http://127.0.0.1:1", "--redis", cluster.URL(), "--redis-mode", "cluster"}, "key-salt: required with --redis"},
		"catch-all proxies":  {[]string{"--origin", "http://127.0.0.1:1", "--trusted-proxies", "0.0.0.0/0"}, "trusts every address"},
	} {
		t.Run(name, func(t *testing.T) {
			ports := freePorts(t, 2)
			e := spawnEdge(t, append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(ports[0]), "--admin", "127.0.0.1:" + strconv.Itoa(ports[1])}, c.args...)...)
			code, exited := e.waitExit(20 * time.Second)
			require.True(t, exited, "the edge must not start")
			require.Equal(t, 2, code)
			require.Contains(t, e.out.String(), c.want)
		})
	}
}
