package origin

import (
	"bufio"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestForwardMatchesFieldByField holds forward, which asks for a field only
// when one look over the names found it, to the header a field-by-field
// rewrite writes (every name asked for, deleted and set through fasthttp's
// normalizing calls), byte for byte: the same fields, values, names' case
// and order. The requests are parsed as the server parses them, over every
// combination of the hop's settings.
func TestForwardMatchesFieldByField(t *testing.T) {
	requests := map[string]string{
		"host only":    "Host: shop.example\r\n",
		"browser-like": "Host: shop.example\r\nUser-Agent: Mozilla/5.0\r\nAccept: text/html\r\nAccept-Language: en-GB\r\nCookie: session=1\r\nReferer: https://shop.example/\r\n",
		"forwarding fields, any case, several lines": "Host: shop.example\r\nx-forwarded-for: 198.51.100.1\r\nX-FORWARDED-FOR: 198.51.100.2, 198.51.100.3\r\n" +
			"x-forwarded-proto: https\r\nX-Forwarded-Host: inner.example\r\nforwarded: for=198.51.100.1\r\nForwarded: for=198.51.100.2;proto=https\r\n",
		"empty forwarding values": "Host: shop.example\r\nX-Forwarded-Proto:\r\nX-Forwarded-Host:\r\n",
		"expect":                  "Host: shop.example\r\nExpect: 100-continue\r\nContent-Length: 0\r\n",
		"connection names forwarding fields": "Host: shop.example\r\nConnection: keep-alive, X-Forwarded-For, forwarded, X-Forwarded-Host\r\n" +
			"X-Forwarded-For: 198.51.100.1\r\nForwarded: for=198.51.100.1\r\nX-Forwarded-Host: inner.example\r\nX-Other: 1\r\n",
		"hop-by-hop fields":  "Host: shop.example\r\nProxy-Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: websocket\r\nProxy-Authorization: Basic x\r\n",
		"connection close":   "Host: shop.example\r\nConnection: close\r\nX-Forwarded-For: 198.51.100.1\r\n",
		"client request id":  "Host: shop.example\r\nX-Request-ID: from-client\r\nx-request-id: again\r\n",
		"look-alike names":   "Host: shop.example\r\nX-Forwarded-Fox: 1\r\nForwarder: 1\r\nExpects: 1\r\nX-Forwarded-Hosts: 1\r\nX-Forwarded-Protos: 1\r\n",
		"no host (HTTP/1.0)": "X-Forwarded-For: 198.51.100.1\r\n",
	}
	for name, fields := range requests {
		for _, trusted := range []bool{false, true} {
			for _, tls := range []bool{false, true} {
				for _, peer := range []string{"203.0.113.7", "2001:db8::7", ""} {
					for _, id := range []string{"", "0123456789abcdef"} {
						for _, host := range []string{"shop.example", "shop.example:8443", ""} {
							hop := Hop{Peer: peer, Trusted: trusted, RequestID: id}
							what := fmt.Sprintf("%s, trusted %v, tls %v, peer %q, id %q, host %q", name, trusted, tls, peer, id, host)
							fast, slow := parsedHeader(t, fields), parsedHeader(t, fields)
							var exFast, exSlow exchange
							forward(fast, &exFast, hop, tls, []byte(host))
							forwardFieldByField(slow, &exSlow, hop, tls, []byte(host))
							require.Equal(t, string(slow.Header()), string(fast.Header()), what)
						}
					}
				}
			}
		}
	}
}

// parsedHeader is a GET with fields as the server reads it off the wire
// (HTTP/1.0 without a Host).
func parsedHeader(t *testing.T, fields string) *fasthttp.RequestHeader {
	line := "GET /p?q=1 HTTP/1.1\r\n"
	if !strings.HasPrefix(fields, "Host:") {
		line = "GET /p?q=1 HTTP/1.0\r\n"
	}
	var h fasthttp.RequestHeader
	require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(line+fields+"\r\n"))))
	return &h
}

// forwardFieldByField is forward's rewrite asking for each field by name,
// whether the request carries it or not.
func forwardFieldByField(h *fasthttp.RequestHeader, ex *exchange, hop Hop, tls bool, host []byte) {
	stripHopByHop(h, ex)
	h.Del(fasthttp.HeaderExpect)
	ex.buf = joinLines(ex.buf[:0], h.PeekAll(fasthttp.HeaderXForwardedFor))
	if hop.Peer != "" {
		if len(ex.buf) > 0 {
			ex.buf = append(ex.buf, ", "...)
		}
		ex.buf = append(ex.buf, hop.Peer...)
	}
	h.Del(fasthttp.HeaderXForwardedFor)
	if len(ex.buf) > 0 {
		h.SetBytesV(fasthttp.HeaderXForwardedFor, ex.buf)
	}
	proto := "http"
	if tls {
		proto = "https"
	}
	if !hop.Trusted || len(h.Peek(fasthttp.HeaderXForwardedProto)) == 0 {
		h.Set(fasthttp.HeaderXForwardedProto, proto)
	}
	if !hop.Trusted || len(h.Peek(fasthttp.HeaderXForwardedHost)) == 0 {
		if len(host) > 0 {
			h.SetBytesV(fasthttp.HeaderXForwardedHost, host)
		} else {
			h.Del(fasthttp.HeaderXForwardedHost)
		}
	}
	ex.buf = joinLines(ex.buf[:0], h.PeekAll(headerForwarded))
	if hop.Peer != "" {
		if len(ex.buf) > 0 {
			ex.buf = append(ex.buf, ", "...)
		}
		ex.buf = appendForwarded(ex.buf, hop.Peer, proto, host)
	}
	h.Del(headerForwarded)
	if len(ex.buf) > 0 {
		h.SetBytesV(headerForwarded, ex.buf)
	}
	if hop.RequestID != "" {
		h.Set(headerRequestID, hop.RequestID)
	}
}
