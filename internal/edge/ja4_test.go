package edge

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

const perJA4 = `
version: 1
rules:
  - id: per-ja4
    key: [ja4]
    algorithm: sliding_log
    limit: 2
    window: 1m
`

// ja4Shape is what a JA4 fingerprint of a TCP TLS client looks like.
var ja4Shape = regexp.MustCompile(`^t1[23][di]\d{4}[0-9a-zA-Z]{2}_[0-9a-f]{12}_[0-9a-f]{12}$`)

func TestJA4RuleKey(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	accessLog := filepath.Join(t.TempDir(), "access.log")
	r, _ := startTLSEdge(t, site, perJA4, func(c *config.Config) { c.AccessLog = accessLog })
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, site.ca.PEM, 0o600))
	_, port, _ := net.SplitHostPort(r.TLSAddr())
	curl := func() string {
		out, err := exec.Command("curl", "-sS", "--http1.1", "--cacert", ca, "--resolve", "shop.example.com:"+port+":127.0.0.1",
			"-o", "/dev/null", "-w", "%{http_code}", "https://shop.example.com:"+port+"/").CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}

	// Go's client (crypto/tls, over HTTP/2) spends its fingerprint's quota…
	c := h2Client(site, r)
	var goCodes []int
	for range 3 {
		resp, _ := h2Get(t, c, "https://shop.example.com/")
		goCodes = append(goCodes, resp.StatusCode)
	}
	require.Equal(t, []int{200, 200, 429}, goCodes)
	// …which is not curl's (OpenSSL): another fingerprint, another counter.
	require.Equal(t, []string{"200", "200", "429"}, []string{curl(), curl(), curl()})
	// Plain HTTP has no fingerprint: the rule does not apply.
	require.Equal(t, []int{200, 200, 200}, codes(t, r, 3, "/"))

	// The access log names each request's fingerprint.
	var lines []map[string]any
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(accessLog)
		if err != nil {
			return false
		}
		lines = nil
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil {
				lines = append(lines, m)
			}
		}
		return len(lines) == 9
	}, 5*time.Second, 10*time.Millisecond)
	goFP, _ := lines[0]["ja4"].(string)
	curlFP, _ := lines[3]["ja4"].(string)
	require.Regexp(t, ja4Shape, goFP)
	require.Regexp(t, ja4Shape, curlFP)
	require.NotEqual(t, goFP, curlFP)
	require.True(t, strings.HasPrefix(goFP, "t13d") && goFP[8:10] == "h2", "Go offered h2 first: %s", goFP)
	require.Equal(t, "h1", curlFP[8:10], "curl --http1.1 offers http/1.1: %s", curlFP)
	for i, l := range lines {
		require.Equal(t, lines[min(i/3*3, 8)]["ja4"], l["ja4"], "line %d", i)
	}
	require.Nil(t, lines[6]["ja4"], "no ja4 over plain HTTP")
	t.Logf("Go: %s, curl: %s", goFP, curlFP)
}

// With identity: ja4 a scanner keeps one behaviour score while it rotates
// its address (a new source address per connection); by address, the same
// scan spreads over 80 identities and never scores. A client with another
// TLS stack is not affected.
func TestBehaviourFollowsJA4AcrossAddresses(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	doc := func(identity string) string {
		return "version: 1\nbehaviour:\n  mode: enforce\n  identity: " + identity + "\n" + `rules:
  - {id: per-ip, key: [ip], algorithm: fixed_window, limit: 1000000000, window: 1h, behaviour: true}
`
	}
	// scan sends one request per route, each on a new connection from
	// its own address, and returns the request from which the client was
	// suspicious (its limit a tenth: 1e9 × 0.1), 0 if never.
	scan := func(r *running, routes int, maxVersion uint16) int {
		for i := range routes {
			src := fmt.Sprintf("127.0.%d.%d", 10+i/200, 1+i%200)
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				TLSClientConfig:   &tls.Config{RootCAs: site.ca.Pool, MaxVersion: maxVersion},
				DisableKeepAlives: true,
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
					return d.DialContext(ctx, "tcp", r.TLSAddr())
				},
			}}
			resp, _ := h2Get(t, c, fmt.Sprintf("https://shop.example.com/scan-%x/%d", maxVersion, i))
			m := remainingRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
			require.NotNil(t, m, resp.Header.Get("RateLimit"))
			if n, _ := strconv.ParseInt(m[1], 10, 64); n < 100_000_000 {
				return i + 1
			}
		}
		return 0
	}
	byJA4, _ := startTLSEdge(t, site, doc("ja4"), nil)
	require.Equal(t, 49, scan(byJA4, 80, tls.VersionTLS13), "suspicious from the 48th distinct route, the request after")
	// Another TLS stack (here: TLS 1.2 at most, another fingerprint)
	// starts clean, from the very same addresses.
	require.Equal(t, 0, scan(byJA4, 10, tls.VersionTLS12))

	byAddress, _ := startTLSEdge(t, site, doc("address"), nil)
	require.Equal(t, 0, scan(byAddress, 80, tls.VersionTLS13), "by address, 80 one-request clients")
}
