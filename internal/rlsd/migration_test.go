package rlsd_test

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A day's limit: a test never sees its window end (the windows are
// aligned to UTC midnight, as the reference aligns them).
const migrationConfig = `domain: rl
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
`

func unique(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// referenceEnv is the environment of envoyproxy/ratelimit's container as
// its documentation sets it up, over a Kubernetes-style configuration
// volume.
func referenceEnv(t *testing.T, redisURL string) []string {
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	return []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisURL,
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"LOG_LEVEL=debug",
	}
}

// The reference's container with this binary in its place: Envoy's calls
// over gRPC answered (OK, then OVER_LIMIT past the limit), /healthcheck
// and /json as the reference answers them, its per-descriptor statsd
// counters on a UDP sink, and SIGTERM drained (NOT_SERVING) to exit 0.
func TestMigrationStatsd(t *testing.T) {
	sink := newUDPSink(t)
	env := append(referenceEnv(t, redisAddr(t)),
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT="+strconv.Itoa(sink.port()), "STATS_FLUSH_INTERVAL=50ms")
	p := startRLS(t, env)

	code, body := p.get(t, "/healthcheck")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "OK", body)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, p.health(t))

	user := unique(t)
	for want := uint32(2); ; want-- {
		r := p.call(t, "rl", "user", user)
		require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
		require.Equal(t, want, r.Statuses[0].LimitRemaining)
		require.Equal(t, uint32(3), r.Statuses[0].CurrentLimit.RequestsPerUnit)
		if want == 0 {
			break
		}
	}
	r := p.call(t, "rl", "user", user)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, r.Statuses[0].Code)
	// An unknown domain is answered OK, as the reference answers it.
	require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "other", "user", user).OverallCode)

	// 3 of 3 within the limit, the third past floor(3 × 0.8) = 2 (near),
	// the fourth over.
	want := map[string]int{
		"ratelimit.service.rate_limit.rl.user.total_hits":   4,
		"ratelimit.service.rate_limit.rl.user.within_limit": 3,
		"ratelimit.service.rate_limit.rl.user.near_limit":   1,
		"ratelimit.service.rate_limit.rl.user.over_limit":   1,
	}
	waitFor(t, "statsd counters", 30*time.Second, func() bool {
		got := sink.counters()
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
	require.Zero(t, sink.counters()["ratelimit.service.rate_limit.rl.user.shadow_mode"])

	// /json: the reference's HTTP form of the call.
	jsonUser := unique(t)
	post := func() (int, string) {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Post("http://"+p.http+"/json", "application/json",
			strings.NewReader(`{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"`+jsonUser+`"}]}]}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body = post()
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"overallCode":"OK"`)
	require.Contains(t, body, `"limitRemaining":2`)
	post()
	post()
	code, body = post()
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, `"overallCode":"OVER_LIMIT"`)
	resp, err := http.Post("http://"+p.http+"/json", "application/json", strings.NewReader(`{not json`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// The service's own metrics on the debug port.
	code, body = httpGet("http://" + p.db + "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `edgeguard_rls_requests_total{code="over_limit"}`)

	p.stop(t)
}

// The same with USE_PROMETHEUS: the reference's series names on
// PROMETHEUS_ADDR/PROMETHEUS_PATH; its response header fields under the
// names given; and a variable of the reference this service does not
// honour is named in one line of the start log.
func TestMigrationPrometheus(t *testing.T) {
	port := freePorts(t, 1)[0]
	env := append(referenceEnv(t, redisAddr(t)),
		"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:"+strconv.Itoa(port), "PROMETHEUS_PATH=/prom",
		"NEAR_LIMIT_RATIO=0.5", "CONFIG_TYPE=GRPC_XDS_SOTW", "TRACING_ENABLED=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-RateLimit-Left")
	p := startRLS(t, env)

	var lines []string
	for _, l := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(l, "not supported by edge rls") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, p.log.String())
	require.Contains(t, lines[0], "CONFIG_TYPE")
	require.Contains(t, lines[0], "TRACING_ENABLED")

	user := unique(t)
	r := p.call(t, "rl", "user", user)
	fields := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		fields[h.Key] = h.Value
	}
	require.NotEmpty(t, fields["RateLimit-Reset"])
	require.Equal(t, map[string]string{"RateLimit-Limit": "3", "X-RateLimit-Left": "2", "RateLimit-Reset": fields["RateLimit-Reset"]}, fields)
	for range 3 {
		p.call(t, "rl", "user", user)
	}
	// floor(3 × 0.5) = 1: the second and third hits are near the limit.
	code, body := httpGet("http://127.0.0.1:" + strconv.Itoa(port) + "/prom")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="rl",key1="user",key2=""} 4`,
		`ratelimit_service_rate_limit_within_limit{domain="rl",key1="user",key2=""} 3`,
		`ratelimit_service_rate_limit_near_limit{domain="rl",key1="user",key2=""} 2`,
		`ratelimit_service_rate_limit_over_limit{domain="rl",key1="user",key2=""} 1`,
	} {
		require.Contains(t, body, want)
	}
	p.stop(t)
}

// The binary copied over envoyproxy/ratelimit's own (its image's
// /bin/ratelimit) starts as the service, with no argument: a container
// whose command runs "ratelimit" needs no other change.
func TestInstalledAsRatelimit(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ratelimit")
	data, err := os.ReadFile(edgeBin)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	p := startBin(t, bin, nil, append(referenceEnv(t, redisAddr(t)), "USE_STATSD=false"))
	user := unique(t)
	r := p.call(t, "rl", "user", user)
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	require.Equal(t, uint32(2), r.Statuses[0].LimitRemaining)
	p.stop(t)
}
