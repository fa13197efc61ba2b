package pipeline

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// An origin's own RateLimit fields, in any casing, give way to the edge's:
// one of each goes out, the edge's, spelled as the draft spells them; an
// origin that sends none keeps every field it sent.
func TestOriginRateLimitFieldsGiveWay(t *testing.T) {
	rule := &rules.CompiledRule{ID: "per-ip", Algorithm: limit.FixedWindow, Limit: 3, Window: time.Minute}
	as := []applied{{rule: rule, out: limiter.Decision{Limit: 3, Remaining: 2, ResetAfter: time.Minute}}}
	for name, origin := range map[string]string{
		"none":   "X-Origin: kept\r\n",
		"casing": "ratelimit-policy: \"origin\";q=9\r\nRATELIMIT: \"origin\";r=9;t=1\r\nx-ratelimit-limit: 9\r\nX-Origin: kept\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			var h fasthttp.ResponseHeader
			raw := "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + origin + "\r\n"
			require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw))))
			setRateLimitFields(&h, as, true)
			out := h.String()
			for field, want := range map[string]string{
				"RateLimit-Policy":      `"per-ip";q=3;w=60`,
				"RateLimit":             `"per-ip";r=2;t=60`,
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": "2",
				"X-RateLimit-Reset":     "60",
			} {
				require.Equal(t, 1, bytes.Count(bytes.ToLower([]byte(out)), []byte("\r\n"+strings.ToLower(field)+": ")), "%s in\n%s", field, out)
				require.Contains(t, out, "\r\n"+field+": "+want+"\r\n")
			}
			require.Contains(t, out, "\r\nX-Origin: kept\r\n")
			require.NotContains(t, out, "origin\"")
		})
	}
}
