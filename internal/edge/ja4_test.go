package edge

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	accessLog := filepath.Join(t.TempDir(), "access.log")
	r, _ := startTLSEdge(t, site, perJA4, func(c *Config) { c.AccessLog = accessLog })
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
