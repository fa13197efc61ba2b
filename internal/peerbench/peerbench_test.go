package peerbench

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The smoke tests run each measurement in a tiny mode with real processes
// (the origin, the edge built from this tree, nginx), so the make targets
// cannot rot; they assert only that each ran to its end and that every byte
// matched, never a figure.

var edgeBin string

func TestMain(m *testing.M) {
	ServeOriginIfAsked()
	dir, err := os.MkdirTemp("", "peerbench-edge-")
	if err != nil {
		panic(err)
	}
	edgeBin, err = BuildEdge(dir)
	if err != nil {
		os.RemoveAll(dir)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// nginxBin is Debian's nginx (make tools installs it); EDGEGUARD_NGINX
// names another.
func nginxBin(t *testing.T) string {
	if p := os.Getenv("EDGEGUARD_NGINX"); p != "" {
		return p
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	_, err := os.Stat("/usr/sbin/nginx")
	require.NoError(t, err, "nginx is needed (make tools installs nginx-light)")
	return "/usr/sbin/nginx"
}

func TestStreamSmoke(t *testing.T) {
	var out strings.Builder
	cfg := StreamConfig{EdgeBin: edgeBin, NginxBin: nginxBin(t), Sets: 1, Clients: 2, Requests: 1,
		TTFBSize: 1 << 20, Sizes: []int64{1 << 10, 1 << 20}, Volumes: []int64{4 << 10, 2 << 20}, Out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Stream(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	// Three targets × 2 objects of 1 MiB, and per proxy 4 KiB + 2 MiB, each byte checked.
	require.Equal(t, int64(3*2<<20+2*(4<<10+2<<20)), r.Bytes)
	for _, name := range []string{"origin", "edge", "nginx"} {
		require.Len(t, r.TTFB[name], 1, name)
		require.Positive(t, r.TTFB[name][0].p50, name)
	}
	require.Contains(t, out.String(), "edge÷nginx")
	require.Contains(t, out.String(), "edge−origin ms")
	require.Contains(t, out.String(), "CPU seconds per GiB")
}

// With no sizes only the time to first byte is measured, at one client
// here: no CPU run, no CPU table.
func TestStreamTTFBOnlySmoke(t *testing.T) {
	var out strings.Builder
	cfg := StreamConfig{EdgeBin: edgeBin, NginxBin: nginxBin(t), Sets: 2, Clients: 1, Requests: 3,
		TTFBSize: 1 << 20, Out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Stream(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	// Two sets × three targets × 3 objects of 1 MiB, each byte checked.
	require.Equal(t, int64(2*3*3<<20), r.Bytes)
	for _, name := range []string{"origin", "edge", "nginx"} {
		require.Len(t, r.TTFB[name], 2, name)
	}
	require.Empty(t, r.ProxyCPU)
	require.Contains(t, out.String(), "nginx−origin ms")
	require.NotContains(t, out.String(), "CPU seconds per GiB")
	require.NotContains(t, out.String(), " cpu size=")
}

// With a trace, the edge is traced under the time-to-first-byte load after
// the sets, and every request the decomposition followed has its three
// phases, which add up to its total. Nothing about the figures themselves
// is asserted.
func TestStreamTraceSmoke(t *testing.T) {
	var out strings.Builder
	cfg := StreamConfig{EdgeBin: edgeBin, NginxBin: nginxBin(t), Sets: 1, Clients: 2, Requests: 2,
		TTFBSize: 256 << 10, Trace: time.Second, Out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Stream(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	ph := r.Phases
	require.NotNil(t, ph)
	// The clients fetch at least one batch; the decomposition follows
	// requests of both connections' goroutines, and none it made up.
	require.Positive(t, ph.Fetched)
	require.NotEmpty(t, ph.Total, "no request followed from its arrival to its first byte")
	require.LessOrEqual(t, len(ph.Total), ph.Fetched+2*cfg.Clients)
	require.Len(t, ph.Pre, len(ph.Total))
	require.Len(t, ph.ReadCall, len(ph.Total))
	for i, total := range ph.Total {
		require.GreaterOrEqual(t, ph.Pre[i], 0.0)
		require.Positive(t, ph.Origin[i], "request %d: the origin answered before it was asked", i)
		require.GreaterOrEqual(t, ph.Post[i], 0.0)
		require.Positive(t, ph.ReadCall[i], "request %d", i)
		require.LessOrEqual(t, ph.ReadCall[i], ph.Post[i], "request %d: the read's call outlasts its phase", i)
		require.InDelta(t, total, ph.Pre[i]+ph.Origin[i]+ph.Post[i], 0.01, "request %d", i)
	}
	require.Contains(t, out.String(), "inside the edge, from an execution trace")
}

func TestSlowReadersSmoke(t *testing.T) {
	var out strings.Builder
	cfg := SlowConfig{EdgeBin: edgeBin, NginxBin: nginxBin(t), Clients: 10, Rate: 64 << 10, Hold: time.Second, Ramp: 100 * time.Millisecond,
		ObjectSize: 1 << 30, RcvBuf: 16 << 10, Out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := SlowReaders(ctx, cfg)
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Empty(t, r.FirstError, r.Proxy)
		require.Equal(t, cfg.Clients, r.Open, r.Proxy)
		require.Positive(t, r.Bytes, r.Proxy)
		require.Positive(t, r.LoadKiB, r.Proxy)
	}
	require.Positive(t, rs[0].Goroutines, "the edge's go_goroutines")
}

func TestBigObjectSmoke(t *testing.T) {
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := BigObject(ctx, BigConfig{EdgeBin: edgeBin, Size: 64<<20 + 3, Out: &out})
	require.NoError(t, err, out.String())
	t.Log(out.String())
	require.Equal(t, int64(64<<20+3), r.Bytes)
	require.Equal(t, r.Origin, r.ClientSum)
	require.Len(t, r.ClientSum, 64)
}

// A hostile or mistaken request to the origin gets a 400 and a reason,
// never a panic or a huge allocation.
func TestOriginRefusesBadPaths(t *testing.T) {
	srv := httptest.NewServer(&origin{sums: map[string]string{}})
	defer srv.Close()
	for _, path := range []string{"/obj/", "/obj/abc", "/obj/-1", "/obj/1099511627777", "/obj/1e9", "/x", "/obj/1?sum=" + strings.Repeat("a", 65)} {
		t.Run(path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + path)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
		})
	}
	resp, err := http.Get(srv.URL + "/sum/unknown")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// Objects are prefixes of one stream, whether written from the in-memory
// pattern or generated.
func TestObjectsArePrefixesOfOneStream(t *testing.T) {
	var small, large bytes.Buffer
	require.NoError(t, writeObject(&small, patternSize))
	require.NoError(t, writeObject(&large, patternSize+13))
	require.Equal(t, patternSize+13, large.Len())
	require.True(t, bytes.Equal(small.Bytes(), large.Bytes()[:patternSize]), "the generated object differs from the in-memory one")
}

// A stream the edge cuts before memory is read fails the run (its figure
// would be for fewer streams than asked), saying why.
func TestSlowReadersFailsWhenStreamsAreCut(t *testing.T) {
	var out strings.Builder
	// The edge cuts every body at 0.5 s; the clients read fast, so they see
	// the cut at once (a slow one would first drain the kernel's buffers).
	cfg := SlowConfig{EdgeBin: edgeBin, Clients: 3, Rate: 1 << 30, Hold: 1500 * time.Millisecond,
		ObjectSize: 1 << 40, RcvBuf: 16 << 10, Out: &out,
		EdgeArgs: []string{"--origin-timeout", "500ms"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := SlowReaders(ctx, cfg)
	require.ErrorContains(t, err, "edge: 3 of 3 streams ended early", out.String())
	require.Len(t, rs, 1)
	require.Contains(t, rs[0].FirstError, `edgeguard_origin_streamed_responses_total{end="total_timeout",pool="default"} 3`)
}

// Nonsense settings are refused before any process starts, every problem
// named at once.
func TestConfigsRefuseNonsense(t *testing.T) {
	ctx := context.Background()
	_, err := Stream(ctx, StreamConfig{Sets: 0, Clients: 1, Requests: 0, TTFBSize: -1, Sizes: []int64{0}, Volumes: []int64{0, 1}})
	require.ErrorContains(t, err, "must each be at least 1")
	require.ErrorContains(t, err, "time-to-first-byte object size -1")
	require.ErrorContains(t, err, "1 sizes but 2 volumes")
	require.ErrorContains(t, err, "object size 0")
	require.ErrorContains(t, err, "volume 0 for size 0")

	_, err = SlowReaders(ctx, SlowConfig{Clients: 0, Rate: 0, Hold: 0, Ramp: -1, ObjectSize: maxObject + 1, RcvBuf: 0})
	for _, want := range []string{"clients 0", "rate 0", "hold 0s must be positive", "object size 1099511627777", "SO_RCVBUF 0"} {
		require.ErrorContains(t, err, want)
	}

	_, err = BigObject(ctx, BigConfig{Size: -1})
	require.ErrorContains(t, err, "object size -1")

	_, err = Requests(ctx, RequestsConfig{Sets: 0, Threads: 2, Conns: 1, Duration: 500 * time.Millisecond, Warmup: -1, HAProxyBin: "haproxy"})
	for _, want := range []string{"sets (0)", "connections (1) at least the threads", "duration 500ms must be at least 1s", "warm-up -1ns", "no edge binary", "no nginx binary", "no wrk binary"} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, err.Error(), "no haproxy binary")
}
