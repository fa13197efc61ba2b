package origin

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// Several pools on one registry: each counts under its own pool label,
// and closing one removes its series and no other's.
func TestPoolsShareOneRegistry(t *testing.T) {
	a := startOrigin(t, okHandler("a"))
	b := startOrigin(t, okHandler("b"))
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	pool := func(name string, url ...string) *Proxy {
		cfg := DefaultConfig()
		cfg.Pool, cfg.URLs, cfg.HealthCheckInterval = name, url, 0
		p, err := NewPool(cfg, m, nil)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	shop := pool("shop", a.url())
	api := pool("api", b.url(), "http://"+closedAddr(t))
	require.Equal(t, "shop", shop.Name())
	require.Equal(t, "api", api.Name())

	for range 3 {
		require.Equal(t, 200, get(t, startEdge(t, shop, "203.0.113.7", "rid"), "/").StatusCode())
	}
	require.Equal(t, 200, get(t, startEdge(t, api, "203.0.113.7", "rid"), "/").StatusCode())
	got := gathered(t, reg)
	require.Equal(t, 3.0, got["edgeguard_origin_responses_total{code=2xx,pool=shop}"])
	require.Equal(t, 1.0, got["edgeguard_origin_responses_total{code=2xx,pool=api}"])
	require.Equal(t, 1.0, got["edgeguard_origin_healthy{pool=shop}"])
	require.Equal(t, 2.0, got["edgeguard_origin_healthy{pool=api}"])

	shop.Close()
	got = gathered(t, reg)
	for k := range got {
		require.NotContains(t, k, "pool=shop", "a closed pool leaves no series")
	}
	require.Equal(t, 1.0, got["edgeguard_origin_responses_total{code=2xx,pool=api}"])
	require.Equal(t, 2.0, got["edgeguard_origin_healthy{pool=api}"])

	// A pool rebuilt under the same name before the old one closes (a
	// reload) keeps the series.
	api2 := pool("api", b.url())
	api.Close()
	got = gathered(t, reg)
	require.Equal(t, 1.0, got["edgeguard_origin_responses_total{code=2xx,pool=api}"])
	require.Equal(t, 1.0, got["edgeguard_origin_healthy{pool=api}"])
	api2.Close()
	require.Empty(t, gathered(t, reg))
}

func TestPoolLabelBounded(t *testing.T) {
	m, err := NewMetrics(nil)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.URLs, cfg.HealthCheckInterval = []string{"http://" + closedAddr(t)}, 0
	var pools []*Proxy
	t.Cleanup(func() {
		for _, p := range pools {
			p.Close()
		}
	})
	for i := range maxPools + 2 {
		cfg.Pool = fmt.Sprintf("pool-%d", i)
		p, err := NewPool(cfg, m, nil)
		require.NoError(t, err)
		pools = append(pools, p)
		want := cfg.Pool
		if i >= maxPools {
			want = otherPool
		}
		require.Equal(t, want, p.label, "pool %d", i)
		require.Equal(t, cfg.Pool, p.Name(), "the name itself is kept")
	}
	m.mu.Lock()
	require.Len(t, m.pools, maxPools+1)
	m.mu.Unlock()

	pools[0].Close()
	cfg.Pool = "late"
	p, err := NewPool(cfg, m, nil)
	require.NoError(t, err)
	pools = append(pools, p)
	require.Equal(t, "late", p.label, "a closed pool's place is free again")
}

func TestPoolName(t *testing.T) {
	for name, ok := range map[string]bool{"": true, "default": true, "shop-eu_1.v2": true, strings.Repeat("a", 64): true,
		strings.Repeat("a", 65): false, "a b": false, "x\n": false, "é": false, `a"b`: false, "{pool}": false} {
		cfg := DefaultConfig()
		cfg.URLs, cfg.Pool = []string{"http://a"}, name
		if ok {
			require.NoError(t, cfg.Validate(), "%q", name)
		} else {
			require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "%q", name)
		}
	}
	p := newProxy(t, Config{URLs: []string{"http://a"}})
	require.Equal(t, DefaultPool, p.Name())
}

// Close stops the health checks at once but lets a running stream finish:
// its body arrives whole, and its connection is closed afterwards rather
// than kept idle in a closed pool.
func TestCloseLetsStreamsFinish(t *testing.T) {
	body := make([]byte, 4<<20)
	_, err := rand.Read(body)
	require.NoError(t, err)
	next := make(chan struct{})
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		if ua := string(ctx.UserAgent()); ua == checkUserAgent {
			return
		}
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.Write(body[:1<<20])
			_ = w.Flush()
			<-next
			_, _ = w.Write(body[1<<20:])
		})
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = time.Hour
	reg := prometheus.NewPedanticRegistry()
	p, err := New(cfg, reg, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = true
	require.NoError(t, resp.Read(br))
	require.Equal(t, 200, resp.StatusCode())
	got := make([]byte, 1<<20)
	_, err = io.ReadFull(resp.BodyStream(), got)
	require.NoError(t, err)

	p.Close() // returns with the stream open: a running health loop stops at once
	require.Empty(t, gathered(t, reg), "the closed pool's series are gone")
	close(next)
	rest, err := io.ReadAll(resp.BodyStream())
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(body), sha256.Sum256(append(got, rest...)), "the stream finished whole")
	require.Eventually(t, func() bool { return p.origins[0].client.ConnsCount() == 0 },
		5*time.Second, 5*time.Millisecond, "the stream's connection is closed, not kept idle")
	require.Equal(t, 1.0, counterValue(t, p.metrics.streams[endComplete]))
}
