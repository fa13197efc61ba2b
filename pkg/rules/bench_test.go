package rules

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// benchRules is ten rules of the kinds a real edge carries.
const benchRules = `
version: 1
rules:
  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 100, window: 1m}
  - {id: per-ip-burst, key: [ip], algorithm: token_bucket, limit: 20, window: 1s, burst: 40}
  - {id: api-key, match: {hosts: [api.example.com]}, key: ["header:X-API-Key"], algorithm: token_bucket, limit: 300, window: 1m}
  - {id: api-writes, match: {hosts: [api.example.com], methods: [POST, PUT, DELETE]}, key: [ip], algorithm: sliding_window, limit: 30, window: 1m}
  - {id: admin, match: {path_prefix: [/admin]}, key: [ip], algorithm: fixed_window, limit: 30, window: 1m}
  - {id: login, match: {path_prefix: [/login, /oauth/token], methods: [POST]}, key: [ip], algorithm: sliding_log, limit: 5, window: 1m, min_interval: 1s}
  - {id: search, match: {path_prefix: [/search]}, key: [ip, "query:q"], algorithm: sliding_window, limit: 20, window: 1m, shadow: true}
  - {id: uploads, match: {path_prefix: [/upload], methods: [POST]}, key: [ip], algorithm: concurrency, limit: 4, window: 30s}
  - {id: static, match: {hosts: ["*.cdn.example.com"]}, key: [ip, host], algorithm: fixed_window, limit: 1000, window: 1s, scope: pop}
  - {id: v1, match: {hosts: [api.example.com], path_prefix: [/v1]}, key: [ip, path], algorithm: sliding_window, limit: 60, window: 1m}
`

func BenchmarkMatch(b *testing.B) {
	s := mustCompile(b, mustParse(b, benchRules))
	hdr := func(name string) (string, bool) {
		if name == "X-Api-Key" {
			return "sk_live_0123456789abcdef", true
		}
		return "", false
	}
	req := &Request{
		Host:     "api.example.com",
		Method:   "GET",
		Path:     "/v1/users/42",
		ClientIP: netip.MustParseAddr("203.0.113.7"),
		Header:   hdr,
	}
	dst := make([]Match, 0, 16)
	if got := len(s.Match(req, dst)); got != 4 {
		b.Fatalf("benchmark request matched %d rules, want 4", got)
	}
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Match(req, dst[:0])
	}
}

func BenchmarkMatchIPv6(b *testing.B) {
	s := mustCompile(b, mustParse(b, benchRules))
	req := &Request{Host: "www.example.org", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("2001:db8:1:2:3:4:5:6")}
	dst := make([]Match, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Match(req, dst[:0])
	}
}

func BenchmarkMatchNoRuleApplies(b *testing.B) {
	s := mustCompile(b, mustParse(b, strings.ReplaceAll(benchRules, "key: [ip]", "key: [\"header:X-Never\"]")))
	req := &Request{Host: "other.org", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("203.0.113.7")}
	dst := make([]Match, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Match(req, dst[:0])
	}
}

func BenchmarkNormalizePath(b *testing.B) {
	for _, p := range []string{"/v1/users/42", "/v1//users/./42/", "/admin%2F..%2Fsecret?x=1", "/" + strings.Repeat("segment/", 40)} {
		b.Run(fmt.Sprintf("%.24q", p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = NormalizePath(p)
			}
		})
	}
}
