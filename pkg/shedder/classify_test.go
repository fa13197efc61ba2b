package shedder

import (
	"net/textproto"
	"testing"

	"github.com/stretchr/testify/require"
)

func noHeaders(string) (string, bool) { return "", false }

// headers mimics fasthttp's case-insensitive Peek.
func headers(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[textproto.CanonicalMIMEHeaderKey(kv[i])] = kv[i+1]
	}
	return func(k string) (string, bool) {
		v, ok := m[textproto.CanonicalMIMEHeaderKey(k)]
		return v, ok
	}
}

func TestClassify(t *testing.T) {
	c, err := NewClassifier(DefaultConfig().Tiers)
	require.NoError(t, err)
	tests := []struct {
		name    string
		method  string
		path    string
		header  func(string) (string, bool)
		trusted bool
		want    Tier
	}{
		{"GET is read", "GET", "/a", noHeaders, false, TierRead},
		{"HEAD is read", "HEAD", "/a", noHeaders, false, TierRead},
		{"OPTIONS is read", "OPTIONS", "/a", noHeaders, false, TierRead},
		{"POST is write", "POST", "/a", noHeaders, false, TierWrite},
		{"DELETE is write", "DELETE", "/a", noHeaders, false, TierWrite},
		{"lower-case method is not a read method", "get", "/a", noHeaders, false, TierWrite},
		{"nil header func", "GET", "/a", nil, true, TierRead},

		{"untrusted critical ignored", "GET", "/a", headers("X-Priority", "critical"), false, TierRead},
		{"untrusted critical ignored on write", "POST", "/a", headers("X-Priority", "critical"), false, TierWrite},
		{"trusted critical honoured", "GET", "/a", headers("X-Priority", "critical"), true, TierCritical},
		{"trusted priority is case-insensitive", "POST", "/a", headers("x-priority", " Read "), true, TierRead},
		{"trusted junk priority falls through", "POST", "/a", headers("X-Priority", "urgent"), true, TierWrite},
		{"untrusted test mode ignored", "GET", "/a", headers("X-Test-Mode", "1"), false, TierRead},
		{"trusted test mode", "POST", "/a", headers("X-Test-Mode", "1"), true, TierTest},
		{"trusted test mode true", "GET", "/a", headers("X-Test-Mode", "true"), true, TierTest},
		{"trusted test mode off", "GET", "/a", headers("X-Test-Mode", "0"), true, TierRead},
		{"test mode beats claimed critical", "GET", "/a", headers("X-Test-Mode", "1", "X-Priority", "critical"), true, TierTest},
		{"trusted priority beats path", "GET", "/healthcheck", headers("X-Priority", "test"), true, TierTest},

		{"healthcheck path is critical from a trusted peer", "GET", "/healthcheck", noHeaders, true, TierCritical},
		{"healthcheck subpath", "POST", "/healthcheck/deep", noHeaders, true, TierCritical},
		{"healthcheck with query", "GET", "/healthcheck?x=1", noHeaders, true, TierCritical},
		{"untrusted healthcheck is not critical", "GET", "/healthcheck/x", noHeaders, false, TierRead},
		{"untrusted healthcheck write", "POST", "/healthcheck", noHeaders, false, TierWrite},
		{"prefix matches whole segments only", "GET", "/healthcheckx", noHeaders, true, TierRead},
		{"synthetic path is test", "POST", "/internal/synthetic/probe", noHeaders, false, TierTest},
		{"path beats api key", "GET", "/healthcheck", headers("X-Api-Key", "test_abc"), true, TierCritical},
		{"untrusted healthcheck falls through to the api key", "GET", "/healthcheck", headers("X-Api-Key", "test_abc"), false, TierTest},

		{"test api key", "POST", "/a", headers("X-Api-Key", "test_abc"), false, TierTest},
		{"bearer test api key", "POST", "/a", headers("X-Api-Key", "Bearer test_abc"), false, TierTest},
		{"live api key uses method", "POST", "/a", headers("X-Api-Key", "live_abc"), false, TierWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, c.Classify(tt.method, tt.path, tt.header, tt.trusted))
		})
	}
}

func TestClassifierConfigurable(t *testing.T) {
	cfg := TierConfig{
		PriorityHeader: "X-Edge-Class",
		APIKeyHeader:   "Authorization",
		Paths:          []PrefixRule{{Prefix: "/static/", Tier: TierTest}, {Prefix: "/static/important", Tier: TierCritical, TrustedOnly: true}},
		APIKeys:        []PrefixRule{{Prefix: "bot_", Tier: TierTest}, {Prefix: "pay_", Tier: TierWrite}},
		ReadMethods:    []string{"GET"},
	}
	c, err := NewClassifier(cfg)
	require.NoError(t, err)
	tests := []struct {
		name    string
		method  string
		path    string
		header  func(string) (string, bool)
		trusted bool
		want    Tier
	}{
		{"first path rule wins", "GET", "/static/important/x", noHeaders, false, TierTest},
		{"trailing slash prefix", "GET", "/static/a.css", noHeaders, false, TierTest},
		{"custom priority header", "GET", "/a", headers("X-Edge-Class", "critical"), true, TierCritical},
		{"default header off", "GET", "/a", headers("X-Priority", "critical"), true, TierRead},
		{"test mode disabled", "GET", "/a", headers("X-Test-Mode", "1"), true, TierRead},
		{"authorization bearer key", "GET", "/a", headers("Authorization", "Bearer bot_1"), false, TierTest},
		{"key rule to write", "GET", "/a", headers("Authorization", "pay_1"), false, TierWrite},
		{"HEAD not a read method here", "HEAD", "/a", noHeaders, false, TierWrite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, c.Classify(tt.method, tt.path, tt.header, tt.trusted))
		})
	}
}

func TestNewClassifierRejects(t *testing.T) {
	_, err := NewClassifier(TierConfig{APIKeys: []PrefixRule{{Prefix: "vip_", Tier: TierCritical}}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "tiers.api_keys[0].tier")
	_, err = NewClassifier(TierConfig{Paths: []PrefixRule{{Prefix: "nope", Tier: Tier(9)}}})
	require.ErrorContains(t, err, "tiers.paths[0].prefix")
	require.ErrorContains(t, err, "tiers.paths[0].tier")
}

func TestTierNames(t *testing.T) {
	for tier := range Tier(numTiers) {
		got, err := ParseTier(tier.String())
		require.NoError(t, err)
		require.Equal(t, tier, got)
	}
	require.Equal(t, "none", TierNone.String())
	_, err := ParseTier("none")
	require.ErrorIs(t, err, ErrInvalidConfig)
	got, err := ParseTier(" CRITICAL ")
	require.NoError(t, err)
	require.Equal(t, TierCritical, got)
	require.Equal(t, []Tier{TierTest, TierRead, TierWrite, TierCritical}, []Tier{0, 1, 2, 3})
}
