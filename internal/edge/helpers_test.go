package edge

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/promtext"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func limiterFailMode(t *testing.T, s string) limiter.FailMode {
	m, err := limiter.ParseFailMode(s)
	require.NoError(t, err)
	return m
}

// metricValue is the value of an unlabelled (but for region/pop) metric.
func metricValue(t *testing.T, r *running, name string) float64 {
	return metricSum(t, r, name)
}

// metricSum adds up the series of a metric whose labels match the given
// name/value pairs, parsed with Prometheus's own text parser.
func metricSum(t *testing.T, r *running, name string, match ...string) float64 {
	mfs, err := promtext.Parse(strings.NewReader(scrape(t, r)))
	require.NoError(t, err)
	_, ok := mfs[name]
	require.True(t, ok, "metric %s not exported", name)
	return promtext.Sum(mfs, name, match...)
}

// spoofedFields are the request fields an untrusted peer must not get
// past the edge (the trust model in internal/edge/trust): what the
// hostile-client tests send, listed here so that a name dropped from the
// edge's screen fails them.
var spoofedFields = []string{
	"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
	"x-forwarded-port", "x-forwarded-prefix", "x-forwarded-scheme", "x-forwarded-server",
	"x-forwarded-ssl", "x-forwarded-uri", "x-forwarded-path", "x-forwarded-client-cert",
	"x-original-forwarded-for", "front-end-https", "x-url-scheme", "x-real-ip",
	"true-client-ip", "x-client-ip", "client-ip", "cf-connecting-ip", "cf-connecting-ipv6",
	"fastly-client-ip", "x-cluster-client-ip", "x-proxyuser-ip", "x-envoy-external-address",
	"x-original-url", "x-original-uri", "x-original-host", "x-rewrite-url", "x-host",
	"x-http-method-override", "x-http-method", "x-method-override",
}
