package edgeguard

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// startRLSEdge builds and starts a real edge (memory store, the
// repository's example rules, its demo origin) serving Envoy's rate limit
// service from a document of 2 calls per user and hour, and returns the
// service's address once it answers SERVING.
func startRLSEdge(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "edge")
	build := exec.Command("go", "build", "-o", bin, "./cmd/edge")
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the edge: %s", out)
	conf := filepath.Join(dir, "rls")
	require.NoError(t, os.MkdirAll(conf, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(conf, "k6.yaml"), []byte("domain: k6\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"), 0o600))
	rls := freeAddr(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, "--listen", freeAddr(t), "--admin", freeAddr(t), "--rules", "../examples/rules.yaml", "--demo-origin",
		"--rls-listen", rls, "--rls-config-dir", conf, "--drain-delay", "0")
	// The edge reads EDGEGUARD_<FLAG> from its environment: none of the
	// test's own (EDGEGUARD_CONSUL names the harness's Consul binary).
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGEGUARD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "EDGEGUARD_KEY_SALT=k6-extension-test-salt")
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("edge output:\n%s", log.String())
		}
	})
	conn, err := grpc.NewClient(rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true // said below
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && h.Status == healthpb.HealthCheckResponse_SERVING
	}, 30*time.Second, 50*time.Millisecond, "the edge's rate limit service serving")
	select {
	case <-exited:
		require.FailNow(t, "the edge exited")
	default:
	}
	return rls
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// rls(target).shouldRateLimit asks a real edge's rate limit service what
// Envoy's filter would: OK within the document's limit, then OVER_LIMIT,
// with the descriptor's limit and what remains; every call is counted in
// edgeguard_rls_calls by code and timed; a service that does not answer is
// code ERROR (counted), not an exception that would stop the iteration.
func TestRLSThroughTheModule(t *testing.T) {
	target := startRLSEdge(t)
	v := newVU(t, New(), 1, initCode)
	require.NoError(t, v.rt.VU.Runtime().Set("TARGET", target))
	got := v.run(t, `
var c = eg.rls(TARGET, { timeout: '5s' });
var out = [];
for (var i = 0; i < 3; i++) {
  var r = c.shouldRateLimit({ domain: 'k6', descriptors: [[{ key: 'user', value: 'u1' }]] });
  out.push([r.code, r.statuses.length, r.statuses[0].code, r.statuses[0].limit, r.statuses[0].unit, r.statuses[0].remaining, r.durationMs > 0]);
}
// A descriptor the document does not know: OK, without a limit.
var free = c.shouldRateLimit({ domain: 'k6', descriptors: [[{ key: 'path', value: '/' }]] });
out.push([free.code, free.statuses.length, free.statuses[0].code, free.statuses[0].limit, '', 0, true]);
c.close();
JSON.stringify(out);
`).String()
	require.JSONEq(t, `[
		["OK", 1, "OK", 2, "HOUR", 1, true],
		["OK", 1, "OK", 2, "HOUR", 0, true],
		["OVER_LIMIT", 1, "OVER_LIMIT", 2, "HOUR", 0, true],
		["OK", 1, "OK", 0, "", 0, true]
	]`, got)

	// Nothing listens there: the answer says so.
	require.NoError(t, v.rt.VU.Runtime().Set("NOWHERE", freeAddr(t)))
	got = v.run(t, `
var d = eg.rls(NOWHERE, { timeout: '2s' }).shouldRateLimit({ domain: 'k6', descriptors: [[{ key: 'user', value: 'u1' }]] });
JSON.stringify([d.code, d.error.indexOf('Unavailable') >= 0]);
`).String()
	require.JSONEq(t, `["ERROR", true]`, got)

	calls := map[string]float64{}
	timed := 0
	for {
		select {
		case sc := <-v.samples:
			for _, s := range sc.GetSamples() {
				tags := s.Tags.Map()
				switch s.Metric.Name {
				case MetricRLSCalls:
					calls[tags["code"]] += s.Value
				case MetricRLSDuration:
					timed++
					require.Positive(t, s.Value)
				}
			}
			continue
		default:
		}
		break
	}
	require.Equal(t, map[string]float64{"OK": 3, "OVER_LIMIT": 1, "ERROR": 1}, calls)
	require.Equal(t, 5, timed)

	_, err := v.rt.VU.Runtime().RunString(`eg.rls(TARGET).shouldRateLimit({ domain: 'k6', descriptors: [[{ key: 'user', value: 'u1' }]], hits: 2 })`)
	require.ErrorContains(t, err, `unknown field "hits"`)
}
