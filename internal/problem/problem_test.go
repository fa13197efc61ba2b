package problem

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

func TestAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  func(ctx *fasthttp.RequestCtx)
		status  int
		headers map[string]string // "" means absent
		body    string
		closes  bool
	}{
		{"refuse", func(ctx *fasthttp.RequestCtx) { Refuse(ctx, 405, "method TRACE is not allowed") }, 405,
			map[string]string{"Content-Type": "application/problem+json", "Cache-Control": "no-store", "Retry-After": "", NotProcessed: ""},
			`{"type":"about:blank","title":"Method Not Allowed","status":405,"detail":"method TRACE is not allowed"}`, false},
		{"too large", func(ctx *fasthttp.RequestCtx) { TooLarge(ctx, 1024) }, 413,
			map[string]string{"Retry-After": ""},
			`{"type":"about:blank","title":"Request Entity Too Large","status":413,"detail":"the request body exceeds 1024 bytes"}`, true},
		{"unavailable", func(ctx *fasthttp.RequestCtx) { Unavailable(ctx, "no worker free; retry later", 1) }, 503,
			map[string]string{"Retry-After": "1", NotProcessed: "1"},
			`{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Service Unavailable","status":503,"detail":"no worker free; retry later"}`, false},
		{"retry-after at least 1", func(ctx *fasthttp.RequestCtx) {
			Write(ctx, Problem{Type: QuotaExceeded, Title: "Too Many Requests", Status: 429}, 0)
		}, 429,
			map[string]string{"Retry-After": "1"},
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			ctx.Response.Header.Set("X-Before", "dropped") // the answer replaces what was there
			tc.answer(&ctx)
			require.Equal(t, tc.status, ctx.Response.StatusCode())
			require.Empty(t, ctx.Response.Header.Peek("X-Before"))
			for k, v := range tc.headers {
				require.Equal(t, v, string(ctx.Response.Header.Peek(k)), k)
			}
			require.Equal(t, tc.body, string(ctx.Response.Body()))
			require.Equal(t, tc.closes, ctx.Response.ConnectionClose())
		})
	}
}
