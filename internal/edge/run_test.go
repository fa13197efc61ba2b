package edge

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// ownGoroutines returns the stacks of the goroutines that Run (package
// lifecycle: it starts the servers), the Consul link or the shedder's
// sampler run or started, as the runtime sees them at this instant.
func ownGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		s := string(g)
		for _, f := range []string{
			"edgeguard/internal/edge.(*Edge).Run",
			"edgeguard/internal/edge/lifecycle.",
			"edgeguard/internal/edge/consullink.(*Link)",
			"edgeguard/pkg/region.(*Client).watch",
			"edgeguard/pkg/shedder.(*Shedder).Run",
		} {
			if strings.Contains(s, f) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// Run owns every goroutine it starts: when it returns, none is left, not
// even one still on its way out (the check is immediate, no retry). The
// witness: while the edge runs, the same check sees the servers, the
// reload loop, the sampler and the Consul watches.
func TestRunWaitsForItsGoroutines(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	r := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(t.TempDir(), "rules.yaml"))

	want := []string{"fasthttp.(*Server).Serve", "net/http.(*Server).Serve", "lifecycle.reloadOnSignal", "(*Shedder).Run",
		"(*Link).register", "(*Link).countEdges", "(*Client).WatchPoPRules", "(*Client).WatchPoPShedder"}
	require.Eventually(t, func() bool {
		all := strings.Join(ownGoroutines(), "\n")
		for _, w := range want {
			if !strings.Contains(all, w) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the running edge's goroutines are visible: %v", want)

	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return within 30s of its context ending; still running:\n%s", strings.Join(ownGoroutines(), "\n\n"))
	}
	require.NoError(t, r.stopErr)
	require.Empty(t, ownGoroutines(), "goroutines left running after Run returned")
}

// TestRunStoppedAtOnceReturns: an edge whose context is done before Run
// starts still returns, every time: its servers may not have begun to
// serve when the shutdown runs (a fasthttp Serve that registered its
// listener after Shutdown used to accept forever).
func TestRunStoppedAtOnceReturns(t *testing.T) {
	for i := range 20 {
		cfg := config.DefaultConfig()
		cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Origins = []string{testOrigin(t)}
		cfg.DrainDelay = 0
		cfg.AdminToken = testAdminToken
		e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		select {
		case err := <-done:
			require.NoError(t, err, "run %d", i)
		case <-testenv.Within(t, 20*time.Second).Done():
			t.Fatalf("run %d: Run did not return; still running:\n%s", i, strings.Join(ownGoroutines(), "\n\n"))
		}
	}
}
