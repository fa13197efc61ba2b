package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// startUnreadyEdge starts an edge that must come up not ready: a
// fail-closed edge whose Redis cannot be reached answers /readyz 503
// ("unavailable: ...") from the start, as every request would get a 503.
// It waits until /readyz answers that, and fails the test if it answers
// 200.
func startUnreadyEdge(t *testing.T, args ...string) *edgeProc {
	t.Helper()
	ports := freePorts(t, 2)
	e := spawnEdge(t, append([]string{
		"--listen", "127.0.0.1:" + strconv.Itoa(ports[0]),
		"--admin", "127.0.0.1:" + strconv.Itoa(ports[1]),
		"--drain-delay", "0",
	}, args...)...)
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	require.NoError(t, proc.PollEvery(testenv.Within(t, 20*time.Second), 10*time.Millisecond, "/readyz to answer 503 unavailable", func(context.Context) error {
		if !e.Alive() {
			return fmt.Errorf("process exited: %s", e.logTail(20))
		}
		resp, err := c.Get("http://" + e.Admin + "/readyz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("/readyz answered 200 %q: a fail-closed edge without its store must not be ready", body)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(string(body), "unavailable: ") {
			return fmt.Errorf("/readyz answered %d %q", resp.StatusCode, body)
		}
		return nil
	}))
	return e
}
