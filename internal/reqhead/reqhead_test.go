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
			why := reqhead.SettleHost(r, tc.def, config.UsableHost)
			if tc.why != "" {
				require.Contains(t, why, tc.why)
				return
			}
			require.Empty(t, why)
			require.Equal(t, tc.host, string(r.Header.Host()))
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
