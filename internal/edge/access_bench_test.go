package edge

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// BenchmarkHandlerAccessLog measures the request handler (identify, match,
// one limit on the memory store, proxy to a loopback origin) on two edges,
// one without and one with --access-log, taking requests alternately in one
// loop so both see the same load: compare on-ns/req with off-ns/req (and
// on/off) of one run, over -count. The writer goroutine's CPU is not in
// these figures (BenchmarkAccessLogWrk in internal/edge/e2e measures the
// whole process); allocs/req are counted with testing.AllocsPerRun.
func BenchmarkHandlerAccessLog(b *testing.B) {
	origin := benchOrigin(b)
	start := func(log bool) *Edge {
		cfg := config.DefaultConfig()
		cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Origins = []string{origin}
		cfg.Rules = filepath.Join(b.TempDir(), "rules.yaml")
		require.NoError(b, os.WriteFile(cfg.Rules, []byte("version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: token_bucket, limit: 1000000, window: 1s}\n"), 0o600))
		if log {
			cfg.AccessLog = filepath.Join(b.TempDir(), "access.log")
		}
		e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
		return e
	}
	offOn(b, [2]*Edge{start(false), start(true)}, benchRequests(b, 2))
}
