package rlsconfig

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

func mustLoad(t *testing.T, files map[string]string, merge bool) *Config {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	c, err := LoadDir(dir, merge)
	require.NoError(t, err)
	return c
}

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

// TestLookupFollowsTheReference walks the matching rules the reference
// documents: most specific first (key and value, then wildcard, then key),
// one level per entry, a limit only at the request's last entry.
func TestLookupFollowsTheReference(t *testing.T) {
	data, err := os.ReadFile("testdata/messaging.yaml")
	require.NoError(t, err)
	c := mustLoad(t, map[string]string{"config/messaging.yaml": string(data)}, false)
	require.Equal(t, []string{"messaging"}, c.Domains())

	tests := []struct {
		name    string
		domain  string
		entries []Entry
		path    string // "" for no limit
		rpu     uint32
		unit    Unit
		check   func(*testing.T, Match)
	}{
		{name: "nested, key only at the second level", entries: entries("message_type", "marketing", "to_number", "2061111111"), path: "messaging.message_type_marketing.to_number", rpu: 5, unit: Day},
		{name: "key only at the top", entries: entries("to_number", "2061111111"), path: "messaging.to_number", rpu: 100, unit: Day},
		{name: "nested level without a match", entries: entries("message_type", "transactional", "to_number", "1")},
		{name: "placeholder level has no limit", entries: entries("message_type", "marketing")},
		{name: "key and value before key", entries: entries("remote_address", "50.0.0.5"), path: "messaging.remote_address_50.0.0.5", rpu: 0, unit: Second},
		{name: "other values take the key's", entries: entries("remote_address", "50.0.0.1"), path: "messaging.remote_address", rpu: 10, unit: Second},
		{name: "more entries than levels", entries: entries("remote_address", "50.0.0.1", "x", "y")},
		{name: "fewer entries than levels", entries: entries("service", "s")},
		{name: "example 4: depth must match", entries: entries("key", "value", "subkey", "subvalue")},
		{name: "unlimited", entries: entries("ldap", "x"), path: "messaging.ldap", check: func(t *testing.T, m Match) { require.True(t, m.Limit.Unlimited) }},
		{name: "shadow", entries: entries("service", "auth", "user", "user-a"), path: "messaging.service.user_user-a", rpu: 10, unit: Second, check: func(t *testing.T, m Match) { require.True(t, m.Limit.Shadow) }},
		{name: "not shadow", entries: entries("service", "auth", "user", "user-b"), path: "messaging.service.user_user-b", rpu: 20, unit: Second, check: func(t *testing.T, m Match) { require.False(t, m.Limit.Shadow) }},
		{name: "named", entries: entries("key_1", "value_1", "user", "bkthomps"), path: "messaging.key_1_value_1.user_bkthomps", rpu: 5, unit: Second, check: func(t *testing.T, m Match) { require.Equal(t, "specific_limit", m.Limit.Name) }},
		{name: "replaces", entries: entries("key_2", "value_2", "user", "bkthomps"), path: "messaging.key_2_value_2.user_bkthomps", rpu: 10, unit: Second, check: func(t *testing.T, m Match) { require.Equal(t, []string{"specific_limit"}, m.Limit.Replaces) }},
		{name: "prefix wildcard, shared", entries: entries("path", "/files/a.pdf"), path: "messaging.path_/files/*", rpu: 3, unit: Minute, check: func(t *testing.T, m Match) { require.Equal(t, []string{"/files/*"}, m.Shared) }},
		{name: "prefix wildcard matches the empty rest", entries: entries("path", "/files/"), path: "messaging.path_/files/*", rpu: 3, unit: Minute},
		{name: "inner wildcard", entries: entries("path", "/api/v2/items"), path: "messaging.path_/api/*/items", rpu: 7, unit: Hour, check: func(t *testing.T, m Match) { require.Nil(t, m.Shared) }},
		{name: "inner wildcard needs the suffix", entries: entries("path", "/api/v2/itemz")},
		{name: "wildcard not shared", entries: entries("path", "/static/app.js"), path: "messaging.path_/static/*", rpu: 1000, unit: Week, check: func(t *testing.T, m Match) { require.Nil(t, m.Shared) }},
		{name: "year", entries: entries("tenant", "yearly"), path: "messaging.tenant_yearly", rpu: 1000000, unit: Year},
		{name: "unit in upper case", entries: entries("tenant", "monthly"), path: "messaging.tenant_monthly", rpu: 1000, unit: Month},
		{name: "values are case-sensitive", entries: entries("tenant", "Yearly")},
		{name: "unknown domain", domain: "other", entries: entries("to_number", "1")},
		{name: "no entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.domain
			if d == "" {
				d = "messaging"
			}
			m := c.Lookup(d, tt.entries)
			if tt.path == "" {
				require.Nil(t, m.Limit)
				return
			}
			require.NotNil(t, m.Limit)
			require.Equal(t, tt.path, m.Limit.Path)
			if !m.Limit.Unlimited {
				require.Equal(t, tt.rpu, m.Limit.RequestsPerUnit)
				require.Equal(t, tt.unit, m.Limit.Unit)
				require.Equal(t, tt.unit.Duration(), m.Limit.Window)
				require.Equal(t, limit.FixedWindow, m.Limit.Algorithm)
			}
			if tt.check != nil {
				tt.check(t, m)
			}
		})
	}
}

func TestWildcardOrderIsTheDocuments(t *testing.T) {
	c := mustLoad(t, map[string]string{"a.yaml": `
domain: d
descriptors:
  - key: p
    value: /a/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: p
    value: /a/b*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: p
    value: /a/b/c
    rate_limit: {unit: second, requests_per_unit: 3}
`}, false)
	require.EqualValues(t, 1, c.Lookup("d", entries("p", "/a/bx")).Limit.RequestsPerUnit, "first wildcard in document order")
	require.EqualValues(t, 3, c.Lookup("d", entries("p", "/a/b/c")).Limit.RequestsPerUnit, "an exact value before any wildcard")
}

func TestExtensions(t *testing.T) {
	c := mustLoad(t, map[string]string{"x.yaml": `
domain: x
descriptors:
  - key: user
    rate_limit:
      algorithm: token_bucket
      window: 90s
      requests_per_unit: 30
      burst: 60
  - key: conn
    rate_limit:
      algorithm: concurrency
      unit: minute
      requests_per_unit: 4
`}, false)
	l := c.Lookup("x", entries("user", "u")).Limit
	require.Equal(t, limit.TokenBucket, l.Algorithm)
	require.Equal(t, 90*time.Second, l.Window)
	require.Equal(t, UnitNone, l.Unit)
	require.EqualValues(t, 60, l.Burst)
	l = c.Lookup("x", entries("conn", "c")).Limit
	require.Equal(t, limit.Concurrency, l.Algorithm)
	require.Equal(t, time.Minute, l.Window)
}

func TestDomainsAcrossFiles(t *testing.T) {
	a := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	b := "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(a), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "b.yml"), []byte(b), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not yaml"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "..data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "..data", "c.yaml"), []byte("nonsense: ["), 0o644))

	_, err := LoadDir(dir, false)
	require.ErrorContains(t, err, filepath.Join(dir, "sub", "b.yml")+`: domain: domain "d" already declared in `+filepath.Join(dir, "a.yaml"))
	require.ErrorIs(t, err, ErrInvalid)

	c, err := LoadDir(dir, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, c.Lookup("d", entries("a", "1")).Limit.RequestsPerUnit)
	require.EqualValues(t, 2, c.Lookup("d", entries("b", "1")).Limit.RequestsPerUnit)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "b.yml"), []byte(a), 0o644))
	_, err = LoadDir(dir, true)
	require.ErrorContains(t, err, "b.yml:3: descriptor d.a: duplicate descriptor")

	// An empty directory is served as the reference serves it: no domain,
	// every descriptor without a limit. A missing one is an error.
	empty := t.TempDir()
	c, err = LoadDir(empty, false)
	require.NoError(t, err)
	require.Empty(t, c.Domains())
	require.Nil(t, c.Lookup("d", entries("a", "1")).Limit)
	_, err = LoadDir(filepath.Join(empty, "typo"), false)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestWildcardMatch(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*", "", true}, {"*", "x", true},
		{"a*c", "abc", true}, {"a*c", "ac", true}, {"a*c", "a", false}, {"a*c", "abd", false},
		{"a*b*c", "a-b-c", true}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true},
		{"x", "x", true}, {"x", "y", false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, wildcardMatch(splitStar(tt.pattern), tt.value), "%q ~ %q", tt.pattern, tt.value)
	}
}

func splitStar(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '*' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
