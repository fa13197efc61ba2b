package origin

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// Only an HTTP/1.1 GET without a body, Connection naming upgrade (and not
// close) and one Upgrade line naming no h2c is tunnelled; anything else is
// proxied with its Upgrade stripped.
func TestTunnelsWants(t *testing.T) {
	const ws = "Upgrade: websocket\r\n"
	for name, tc := range map[string]struct {
		req  string
		want bool
	}{
		"websocket":                     {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n" + ws + "\r\n", true},
		"connection list":               {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, upgrade\r\n" + ws + "\r\n", true},
		"empty body declared":           {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nContent-Length: 0\r\n" + ws + "\r\n", true},
		"h2c":                           {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n", false},
		"h2c last in a list":            {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket, H2C\r\n\r\n", false},
		"h2c with a version":            {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c/1\r\n\r\n", false},
		"two Upgrade lines":             {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n" + ws + "Upgrade: h2c\r\n\r\n", false},
		"empty Upgrade":                 {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: \r\n\r\n", false},
		"no Connection":                 {"GET / HTTP/1.1\r\nHost: a\r\n" + ws + "\r\n", false},
		"Connection close":              {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade, close\r\n" + ws + "\r\n", false},
		"POST":                          {"POST / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nContent-Length: 0\r\n" + ws + "\r\n", false},
		"body":                          {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nContent-Length: 3\r\n" + ws + "\r\nabc", false},
		"HTTP/1.0":                      {"GET / HTTP/1.0\r\nHost: a\r\nConnection: upgrade\r\n" + ws + "\r\n", false},
		"no Upgrade":                    {"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n", false},
		"upgrade named in Upgrade only": {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n" + ws + "\r\n", false},
	} {
		t.Run(name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			require.NoError(t, ctx.Request.Read(bufio.NewReader(strings.NewReader(tc.req))))
			tn := &Tunnels{cfg: TunnelConfig{MaxOpen: 1}}
			require.Equal(t, tc.want, tn.Wants(&ctx))
			tn.cfg.MaxOpen = 0
			require.False(t, tn.Wants(&ctx), "--max-tunnels 0 tunnels nothing")
			require.False(t, (*Tunnels)(nil).Wants(&ctx), "no tunnels, no tunnel")
		})
	}
}

func TestNewTunnelsRefusesNegatives(t *testing.T) {
	_, err := NewTunnels(TunnelConfig{MaxOpen: -1}, nil)
	require.Error(t, err)
	_, err = NewTunnels(TunnelConfig{IdleTimeout: -1}, nil)
	require.Error(t, err)
}
