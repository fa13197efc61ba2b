package reqhead_test

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/reqhead"
)

func read(t *testing.T, raw string) *fasthttp.Request {
	t.Helper()
	var r fasthttp.Request
	require.NoError(t, r.Read(bufio.NewReader(strings.NewReader(raw))))
	return &r
}

func TestSettleHost(t *testing.T) {
	for _, tc := range []struct{ name, raw, def, host, why string }{
		{"as sent", "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", "", "a.example", ""},
		{"absolute form wins", "GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", "", "b.example", ""},
		{"user info in Host", "GET / HTTP/1.1\r\nHost: u:p@a.example\r\n\r\n", "", "", "user info"},
		{"user info in the target", "GET http://u@b.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", "", "", "user info"},
		{"no Host, no default", "GET / HTTP/1.0\r\n\r\n", "", "", "no usable Host"},
		{"no Host, the default", "GET / HTTP/1.0\r\n\r\n", "d.example", "d.example", ""},
		{"garbage", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "", "", "no usable Host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := read(t, tc.raw)
			target := strings.Clone(reqhead.TargetHost(r, tc.def)) // r's bytes, which SettleHost may change
			why := reqhead.SettleHost(r, tc.def, config.UsableHost)
			if tc.why != "" {
				require.Contains(t, why, tc.why)
				return
			}
			require.Empty(t, why)
			require.Equal(t, tc.host, string(r.Header.Host()))
			require.Equal(t, tc.host, target, "TargetHost names the Host SettleHost gives")
			require.Zero(t, testing.AllocsPerRun(100, func() { reqhead.TargetHost(r, tc.def) }), "asked on every request with a body")
		})
	}
}

func TestLookupRepeatedReadsAsAbsent(t *testing.T) {
	r := read(t, "GET /?q=1&q=2&p=3 HTTP/1.1\r\nHost: a\r\nX-Api-Key: a\r\nx-api-key: b\r\nX-One: 1\r\n\r\n")
	l := reqhead.New(&r.Header, r.URI().QueryArgs())
	v, ok := l.Get("X-One")
	require.True(t, ok)
	require.Equal(t, "1", v)
	require.Empty(t, l.Repeated())
	_, ok = l.Get("X-Api-Key")
	require.False(t, ok)
	require.Equal(t, "header X-Api-Key", l.Repeated())
	_, ok = l.Query("q")
	require.False(t, ok)
	require.Equal(t, "header X-Api-Key", l.Repeated(), "the first repeated one is named")
	v, ok = l.Query("p")
	require.True(t, ok)
	require.Equal(t, "3", v)

	var none reqhead.Lookup
	_, ok = none.Get("X")
	require.False(t, ok)
}

// TestGetAgreesWithPeekAll: Get, which looks among the names before it
// asks for a field by name, answers what asking by name answers (one
// value, absent, or repeated), for names in any case, the fields fasthttp
// keeps apart among them, on requests that carry them and ones that do not.
func TestGetAgreesWithPeekAll(t *testing.T) {
	requests := []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nUser-Agent: ua\r\nCookie: a=1; b=2\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nconnection: keep-alive, x-a\r\nX-Api-Key: k\r\nx-priority: critical\r\nX-Twice: 1\r\nx-twice: 2\r\nX-Empty:\r\nTrailer: x-t\r\n\r\n",
	}
	names := []string{"X-Api-Key", "x-api-key", "X-API-KEY", "X-Priority", "X-Twice", "X-Empty", "X-Absent", "X-Api-Ke", "X-Api-Keys",
		"Host", "host", "Content-Type", "content-length", "User-Agent", "Cookie", "Connection", "Trailer", "Transfer-Encoding", "TE"}
	for _, raw := range requests {
		for _, name := range names {
			r := read(t, raw)
			l := reqhead.New(&r.Header, nil)
			v, ok := l.Get(name)
			got := []any{v, ok, l.Repeated()}

			want := []any{"", false, ""}
			switch vs := read(t, raw).Header.PeekAll(name); len(vs) {
			case 1:
				want = []any{string(vs[0]), true, ""}
			case 0:
			default:
				want[2] = "header " + name
			}
			require.Equal(t, want, got, "%q in %q", name, raw)
		}
	}
}
