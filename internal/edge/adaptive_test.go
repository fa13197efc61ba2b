package edge

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// With the adaptive origin limit held at one request, a second request
// while the first is at the origin is refused at once with a retry-safe
// 503, and the first is served.
func TestAdaptiveLimitRefusesBeforeTheOrigin(t *testing.T) {
	file := filepath.Join(t.TempDir(), "shedder.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"adaptive": {"enabled": true, "initial_limit": 1, "min_limit": 1, "max_limit": 1,
		"shares": {"read": 0, "write": 0, "critical": 0}}}`), 0o600))
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) { c.Shedder = file })

	first := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + r.Addr() + "/slow?ms=300")
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return r.shed.Adaptive().State().InFlight[shedder.TierRead] == 1 },
		5*time.Second, 2*time.Millisecond, "the first request holds the only origin slot")

	resp := r.get(t, "/")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, "1", resp.Header.Get(problem.NotProcessed))
	var p problem.Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	require.Equal(t, problem.ReducedCapacity, p.Type)
	require.Equal(t, uint64(1), r.shed.Adaptive().State().Rejected[shedder.TierRead])

	require.Equal(t, http.StatusOK, <-first)
	require.Zero(t, r.shed.Adaptive().State().InFlight[shedder.TierRead], "the slot is given back")
}

// Only the edge says a request was not processed: an origin's 503 with the
// same header reaches the client without it.
func TestOriginCannotClaimNotProcessed(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(problem.NotProcessed, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer origin.Close()
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) { c.Origins = []string{origin.URL} })
	resp := r.get(t, "/")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Empty(t, resp.Header.Get(problem.NotProcessed))
}
