package peerbench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// h2load against real TLS servers on loopback: one offering h2 is measured
// (its count is the server's), one offering only http/1.1 is refused by
// name, and 5xx answers are counted as such.
func TestRunH2load(t *testing.T) {
	bin := h2loadBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var served, h2 atomic.Int64
	status := atomic.Int32{}
	status.Store(http.StatusOK)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if r.ProtoMajor == 2 {
			h2.Add(1)
		}
		w.WriteHeader(int(status.Load()))
	})

	srv := httptest.NewUnstartedServer(handler)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	r, err := runH2load(ctx, bin, srv.URL+"/", 2, 4, time.Second)
	require.NoError(t, err)
	require.Positive(t, r.Requests)
	require.Positive(t, r.PerSecond)
	require.Zero(t, r.Non2xx)
	require.Zero(t, r.SocketErrors)
	// Every request counted reached the server over HTTP/2 (the server may
	// have served a few more: the ones in flight when the run ended).
	require.Equal(t, served.Load(), h2.Load())
	require.GreaterOrEqual(t, served.Load(), r.Requests)

	status.Store(http.StatusBadGateway)
	r, err = runH2load(ctx, bin, srv.URL+"/", 1, 1, time.Second)
	require.NoError(t, err)
	require.Positive(t, r.Requests)
	require.Equal(t, r.Requests, r.Non2xx)

	h1 := httptest.NewUnstartedServer(handler) // ALPN: http/1.1 only
	h1.StartTLS()
	defer h1.Close()
	_, err = runH2load(ctx, bin, h1.URL+"/", 1, 1, time.Second)
	require.ErrorContains(t, err, "want h2")
}

const h2loadReport = `starting benchmark...
spawning thread #0: 16 total client(s). Timing-based test with 0s of warm-up time and 1s of main duration for measurements.
Warm-up started for thread #0.
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 1.00s, 10123.00 req/s, 395.44KB/s
requests: 10123 total, 10283 started, 10123 done, 10120 succeeded, 3 failed, 1 errored, 2 timeout
status codes: 10100 2xx, 20 3xx, 2 4xx, 1 5xx
traffic: 395.44KB (404933) total, 128.53KB (131613) headers (space savings 80.03%), 19.77KB (20246) data
                     min         max         mean         sd        +/- sd
time for request:      402us     12.56ms      1.53ms       812us    77.77%
`

func TestParseH2load(t *testing.T) {
	r, err := parseH2load(h2loadReport)
	require.NoError(t, err)
	require.Equal(t, wrkResult{Requests: 10123, Seconds: 1, PerSecond: 10123, SocketErrors: 5, Non2xx: 3}, r)

	for name, tc := range map[string]struct{ report, errMsg string }{
		"http/1.1":        {strings.Replace(h2loadReport, "protocol: h2", "protocol: http/1.1", 1), `application protocol "http/1.1", want h2`},
		"no protocol":     {strings.Replace(h2loadReport, "Application protocol: h2\n", "No protocol negotiated. Fallback behaviour may be activated\n", 1), `application protocol "", want h2`},
		"empty":           {"", `no "finished in", "requests:", "status codes:"`},
		"garbage rate":    {strings.Replace(h2loadReport, "10123.00 req/s", "fast req/s", 1), `requests/s "fast req/s"`},
		"garbage count":   {strings.Replace(h2loadReport, "10123 done", "x done", 1), `count " x done"`},
		"no done":         {strings.Replace(h2loadReport, "10123 done, ", "", 1), "no done count"},
		"negative status": {strings.Replace(h2loadReport, "2 4xx", "-2 4xx", 1), `count " -2 4xx"`},
		"garbage time":    {strings.Replace(h2loadReport, "finished in 1.00s", "finished in soon", 1), `duration "soon"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseH2load(tc.report)
			require.ErrorContains(t, err, tc.errMsg)
		})
	}
}

// -scenarios picks scenarios by name, in the table's order; a name no
// scenario has is refused.
func TestRequestsPickedScenarios(t *testing.T) {
	cfg := DefaultRequestsConfig()
	cfg.EdgeBin, cfg.NginxBin, cfg.HAProxyBin = "edge", "nginx", "haproxy"
	require.Len(t, cfg.picked(), len(scenarios))
	cfg.Scenarios = []string{"h2", "tls"}
	require.NoError(t, cfg.validate())
	var names []string
	for _, sc := range cfg.picked() {
		names = append(names, sc.name)
	}
	require.Equal(t, []string{"tls", "h2"}, names)
	cfg.Scenarios = []string{"h2", "h3"}
	require.ErrorContains(t, cfg.validate(), `unknown scenario "h3"`)
	cfg.Scenarios, cfg.H2Streams = nil, 0
	require.ErrorContains(t, cfg.validate(), "h2load's clients (16) and streams per client (0) must be at least 1")
}
