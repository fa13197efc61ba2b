package rls_test

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/rls"
)

// leakDoc has what a descriptor path can reveal: a domain and keys named
// after internal clusters, a configured value (another client's address)
// and a wildcard; and one limit with a rate_limit name.
const leakDoc = `domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {name: per-user, unit: hour, requests_per_unit: 10}
`

// secrets are what no header field may show unless the operator opts in
// to raw paths.
var secrets = []string{"edge_proxy_per_ip", "remote_address", "50.0.0.5", "source_cluster", "destination_cluster", "mock", "/api/"}

// leakRequest sends every descriptor of leakDoc, each value unique to
// this run (random), and a trusted caller's override whose path is made
// of the request's own entries.
func leakRequest(random string) []*rlv3.RateLimitDescriptor {
	o := desc("remote_address", "10."+random)
	o.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	return []*rlv3.RateLimitDescriptor{
		desc("remote_address", "50.0.0.5"),
		desc("remote_address", random),
		desc("source_cluster", "proxy", "destination_cluster", "mock"),
		desc("path", "/api/"+random),
		desc("user", random),
		o,
	}
}

// fields is every header key and value of an answer, the ones for the
// client and the ones for the upstream.
func fields(r *pb.RateLimitResponse) []string {
	var out []string
	for _, h := range append(r.GetResponseHeadersToAdd(), r.GetRequestHeadersToAdd()...) {
		out = append(out, h.GetKey(), h.GetValue())
	}
	return out
}

func randomValue(t *testing.T) string {
	b := make([]byte, 12)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return "v" + hex.EncodeToString(b)
}

var trustLoopback = rls.TrustFrom([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})

// TestHeadersOffByDefault: a service built with default options answers
// no header field at all, as envoyproxy/ratelimit without
// LIMIT_RESPONSE_HEADERS_ENABLED; counting and statuses are unchanged.
func TestHeadersOffByDefault(t *testing.T) {
	s := newService(t, setup{store: stores(t)["memory"](t), doc: leakDoc, opts: rls.Options{TrustOverride: trustLoopback}})
	random := randomValue(t)
	r := s.ask(t, "edge_proxy_per_ip", leakRequest(random)...)
	require.Empty(t, r.ResponseHeadersToAdd)
	require.Empty(t, r.RequestHeadersToAdd)
	require.EqualValues(t, 9, r.Statuses[0].LimitRemaining, "counted as before")
	require.EqualValues(t, 6, r.Statuses[5].LimitRemaining, "the override counted as before")
}

// TestHeadersNameNoDescriptor: with the draft fields on, a limit is named
// by its rate_limit name, else by a salted hash; no domain, key or value
// (configured or sent, a trusted override's included) appears in any
// field. A service with the same salt gives a limit the same name; with
// another salt, another. With raw paths asked for, they appear: the
// search below would see a leak.
func TestHeadersNameNoDescriptor(t *testing.T) {
	salt := []byte("0123456789abcdef0123456789abcdef")
	hashed := regexp.MustCompile(`^rl-[0-9a-f]{12}$`)
	names := func(t *testing.T, s *service, random string) ([]string, *pb.RateLimitResponse) {
		r := s.ask(t, "edge_proxy_per_ip", leakRequest(random)...)
		require.Len(t, r.ResponseHeadersToAdd, 2)
		require.Equal(t, "RateLimit-Policy", r.ResponseHeadersToAdd[0].Key)
		var out []string
		for item := range strings.SplitSeq(r.ResponseHeadersToAdd[0].Value, ", ") {
			name, _, _ := strings.Cut(item, ";")
			out = append(out, strings.Trim(name, `"`))
		}
		return out, r
	}
	opts := rls.Options{Headers: rls.HeadersDraft, TrustOverride: trustLoopback, NameSalt: salt}
	s := newService(t, setup{store: stores(t)["memory"](t), doc: leakDoc, opts: opts})
	random := randomValue(t)
	got, r := names(t, s, random)
	require.Len(t, got, 6)
	for i, n := range got {
		if i == 4 {
			require.Equal(t, "per-user", n, "a rate_limit name is the field's name")
			continue
		}
		require.Regexp(t, hashed, n)
	}
	for _, f := range fields(r) {
		require.NotContains(t, f, random, "a value the client sent")
		for _, secret := range secrets {
			require.NotContains(t, f, secret)
		}
	}

	// One salt, one name per limit; the override's name hides its value.
	again := newService(t, setup{store: stores(t)["memory"](t), doc: leakDoc, opts: opts})
	second, _ := names(t, again, random)
	require.Equal(t, got, second)
	other := opts
	other.NameSalt = []byte("another salt, another name space")
	third, _ := names(t, newService(t, setup{store: stores(t)["memory"](t), doc: leakDoc, opts: other}), random)
	require.NotEqual(t, got[0], third[0])

	// The opt-in: raw descriptor paths, values and all.
	raw := opts
	raw.Names = rls.NamesPath
	paths, r := names(t, newService(t, setup{store: stores(t)["memory"](t), doc: leakDoc, opts: raw}), random)
	require.Equal(t, "edge_proxy_per_ip.remote_address_50.0.0.5", paths[0])
	require.Equal(t, "edge_proxy_per_ip.remote_address_10."+random, paths[5])
	require.True(t, slicesContains(fields(r), random), "the opt-in shows what the default hides")
}

func slicesContains(fs []string, s string) bool {
	for _, f := range fs {
		if strings.Contains(f, s) {
			return true
		}
	}
	return false
}

func TestParseHeadersAndNames(t *testing.T) {
	h, err := rls.ParseHeaders("")
	require.NoError(t, err)
	require.Equal(t, rls.HeadersOff, h)
	_, err = rls.ParseHeaders("on")
	require.ErrorContains(t, err, "want off, draft or legacy")
	n, err := rls.ParseNames("")
	require.NoError(t, err)
	require.Equal(t, rls.NamesHashed, n)
	_, err = rls.ParseNames("raw")
	require.ErrorContains(t, err, "want hashed or path")
}
