package problem

import (
	"encoding/json"
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

// AppendJSON writes what encoding/json writes, byte for byte, whatever the
// strings hold: a rule id or a detail with quotes, backslashes, HTML
// characters, control characters, non-ASCII or invalid UTF-8.
func TestAppendJSONIsEncodingJSON(t *testing.T) {
	for _, s := range []string{
		"", "plain", `quo"te`, `back\slash`, "<script>", "a&b", "a>b", "tab\there", "nul\x00", "caf\u00e9",
		"line\u2028sep", "bad\xffutf8", "\x7f del", "per-ip", "a/b.c_d~e:f",
	} {
		for _, p := range []Problem{
			{Type: QuotaExceeded, Title: "Too Many Requests", Status: 429, Detail: s, Violated: []string{s, "per-ip"}},
			{Type: s, Title: s, Status: 400},
			{Type: "about:blank", Title: "Bad Request", Status: 400, Detail: "x", Violated: []string{}},
		} {
			want, err := json.Marshal(p)
			require.NoError(t, err)
			require.Equal(t, string(want), string(p.AppendJSON(nil)), "%q", s)
		}
	}
}

// Writing a problem allocates nothing when its strings need no escaping
// beyond a quote or a backslash (the edge's own problems, rule ids).
func TestWriteDoesNotAllocate(t *testing.T) {
	var ctx fasthttp.RequestCtx
	p := Problem{Type: QuotaExceeded, Title: "Too Many Requests", Status: 429, Detail: `retry after "Retry-After"`, Violated: []string{"per-ip", "per-key"}}
	Write(&ctx, p, 3600) // the response's buffers grown once
	require.Zero(t, testing.AllocsPerRun(100, func() { Write(&ctx, p, 3600) }))
	require.Equal(t, "3600", string(ctx.Response.Header.Peek("Retry-After")))
}
