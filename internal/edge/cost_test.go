package edge

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A flood from one client past its rule is answered from the over-limit
// cache once the store has denied it: not one more script call reaches
// Redis, however many denials follow, and X-Forwarded-For values the
// client makes up (it is no trusted proxy) change nothing: its key is its
// address. Each denial is still the full 429: Retry-After, the RateLimit
// fields, the problem document naming the rule.
func TestDeniedFloodMakesNoStoreCall(t *testing.T) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { rd.Close() })
	r := startEdge(t, floodRule, func(c *config.Config) {
		c.Redis, c.RedisTimeout, c.KeySalt = rd.URL(), time.Second, testenv.KeyPrefix(t)
	})
	send := func(xff string) (*http.Response, string) {
		var h []string
		if xff != "" {
			h = []string{"X-Forwarded-For", xff}
		}
		resp := r.get(t, "/flood", h...)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	for i := range 10 {
		resp, _ := send("")
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d of the rule's 10", i+1)
	}
	resp, _ := send("") // the store's denial, which the cache keeps
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	calls := evalshaCalls(t, rd.Addr)

	const flood = 200
	for i := range flood {
		xff := ""
		if i%2 == 1 {
			xff = fmt.Sprintf("198.51.100.%d", i%250) // a spoofed client, one per request
		}
		resp, body := send(xff)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "denial %d", i)
		require.Equal(t, `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"request quota exceeded; retry after the time in Retry-After","violated-policies":["per-ip"]}`, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Equal(t, `"per-ip";q=10;w=3600`, resp.Header.Get("RateLimit-Policy"))
		require.Regexp(t, `^"per-ip";r=0;t=\d+$`, resp.Header.Get("RateLimit"))
	}
	require.Equal(t, calls, evalshaCalls(t, rd.Addr), "script calls during %d denials the cache knew", flood)
}
