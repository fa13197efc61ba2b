package edge

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

type accessLine struct {
	Time     string   `json:"time"`
	ID       string   `json:"id"`
	Client   string   `json:"client"`
	Host     string   `json:"host"`
	Method   string   `json:"method"`
	Path     string   `json:"path"`
	Status   int      `json:"status"`
	Outcome  string   `json:"outcome"`
	Decision string   `json:"decision"`
	Tier     string   `json:"tier"`
	Rules    []string `json:"rules"`
	Source   string   `json:"source"`
	Shed     string   `json:"shed_reason"`
	Refusal  string   `json:"refuse_reason"`
	Upstream float64  `json:"upstream_seconds"`
	Total    float64  `json:"total_seconds"`
	BytesOut int      `json:"bytes_out"`
}

func accessLines(t *testing.T, path string, n int) []accessLine {
	t.Helper()
	var lines []string
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		// Whole lines only: a read may see a line the writer has not
		// finished writing yet.
		whole := b[:bytes.LastIndexByte(b, '\n')+1]
		lines = strings.Split(strings.TrimSuffix(string(whole), "\n"), "\n")
		return len(lines) >= n && lines[0] != ""
	}, 5*time.Second, 5*time.Millisecond)
	out := make([]accessLine, len(lines))
	for i, l := range lines {
		require.NoError(t, json.Unmarshal([]byte(l), &out[i]), l)
	}
	return out
}

// One line per request says who, which rules, which tier, what happened
// and how long it took; a denial is always logged, an allowed request by
// its sample; SIGUSR1 reopens the file for log rotation.
func TestAccessLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, perIP, func(c *config.Config) { c.AccessLog = path })
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/orders?x=1"))
	lines := accessLines(t, path, 4)
	require.Len(t, lines, 4)
	ok, denied := lines[0], lines[3]
	require.Equal(t, "allowed", ok.Decision)
	require.Equal(t, "proxied", ok.Outcome)
	require.Equal(t, 200, ok.Status)
	require.Equal(t, "/orders", ok.Path)
	require.Equal(t, "GET", ok.Method)
	require.Equal(t, "127.0.0.1", ok.Client)
	require.Equal(t, "read", ok.Tier)
	require.Equal(t, []string{"per-ip"}, ok.Rules)
	require.Equal(t, "memory", ok.Source)
	require.Len(t, ok.ID, 32)
	require.Positive(t, ok.Upstream)
	require.GreaterOrEqual(t, ok.Total, ok.Upstream)
	require.Positive(t, ok.BytesOut)

	require.Equal(t, "denied", denied.Decision)
	require.Equal(t, 429, denied.Status)
	require.Equal(t, []string{"per-ip"}, denied.Rules)
	require.Equal(t, "memory", denied.Source)
	require.Zero(t, denied.Upstream, "a denial never reached the origin")
	require.NotEmpty(t, denied.ID)

	// Rotation: rename, signal, and the next line goes to a new file.
	require.NoError(t, os.Rename(path, path+".1"))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, 5*time.Second, 5*time.Millisecond, "reopened")
	codes(t, r, 1, "/after")
	after := accessLines(t, path, 1)
	require.Len(t, after, 1)
	require.Equal(t, "/after", after[0].Path)
	require.Equal(t, 1.0, metricValue(t, r, "edgeguard_edge_access_log_lines_total")-4)
	require.Zero(t, metricValue(t, r, "edgeguard_edge_access_log_dropped_total"))
}

// With --access-log-sample 0 only what the edge answered itself is logged.
func TestAccessLogSamplesAllowedOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, perIP, func(c *config.Config) { c.AccessLog, c.AccessLogSample = path, 0 })
	require.Equal(t, []int{200, 200, 200, 429, 429}, codes(t, r, 5, "/x"))
	lines := accessLines(t, path, 2)
	require.Len(t, lines, 2)
	for _, l := range lines {
		require.Equal(t, "denied", l.Decision)
	}
}

// The RateLimit fields go out spelled as the draft and the README spell
// them (HTTP field names are case-insensitive, but people and some clients
// compare them as written).
func TestRateLimitFieldCasing(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.LegacyHeaders = true })
	c := dialRaw(t, r.Addr())
	_, err := c.Write([]byte("GET /x HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n"))
	require.NoError(t, err)
	raw, _ := io.ReadAll(c)
	for _, f := range []string{"\r\nRateLimit-Policy: ", "\r\nRateLimit: ", "\r\nX-RateLimit-Limit: ", "\r\nX-RateLimit-Remaining: ", "\r\nX-RateLimit-Reset: "} {
		require.Contains(t, string(raw), f)
	}
}
