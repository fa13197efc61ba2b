package rules

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJA4Key(t *testing.T) {
	s := mustCompile(t, mustParse(t, `
version: 1
rules:
  - {id: per-ja4, key: [ja4], algorithm: sliding_log, limit: 10, window: 1m}
  - {id: per-ip-ja4, key: [ip, ja4], algorithm: sliding_log, limit: 10, window: 1m}
`))
	ip := netip.MustParseAddr("203.0.113.7")
	keys := func(ja4 string) map[string]string {
		out := map[string]string{}
		for _, m := range s.Match(&Request{Host: "h", Method: "GET", Path: "/", ClientIP: ip, JA4: ja4}, nil) {
			out[m.Rule.ID] = m.Key
		}
		return out
	}
	curl, goClient := keys("t13d3112h2_e8f1e7e78f70_6bebaf5329ac"), keys("t13d1312h2_f57a46bbacb6_e7c285222651")
	require.Len(t, curl, 2)
	require.NotEqual(t, curl["per-ja4"], goClient["per-ja4"], "one counter per fingerprint")
	require.NotEqual(t, curl["per-ip-ja4"], goClient["per-ip-ja4"])
	require.Empty(t, keys(""), "no fingerprint (plain HTTP): the rules do not apply")

	_, err := Parse([]byte("version: 1\nrules:\n  - {id: r, key: [JA4], algorithm: sliding_log, limit: 1, window: 1m}\n"))
	require.ErrorContains(t, err, `unknown descriptor "JA4"`)
}
