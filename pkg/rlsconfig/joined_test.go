package rlsconfig

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// joinedDoc has descriptors the reference reaches through its joined
// key_value strings.
const joinedDoc = `
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: files
    value: no_share/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 9}
`

// TestLookupJoinsKeyAndValue holds Lookup to the reference's GetLimit,
// which finds descriptors by the string key + "_" + value: entries that
// split that string elsewhere match too, unless StrictMatch.
func TestLookupJoinsKeyAndValue(t *testing.T) {
	doc, err := Parse("joined.yaml", []byte(joinedDoc))
	require.NoError(t, err)
	ref, err := Compile([]*Document{doc}, false)
	require.NoError(t, err)
	strict, err := Compile([]*Document{doc}, false, StrictMatch())
	require.NoError(t, err)
	require.False(t, ref.Strict())
	require.True(t, strict.Strict())

	tests := []struct {
		name    string
		entries []Entry
		ref     uint32 // requests_per_unit under reference matching; 0: no limit
		strict  uint32
		shared  []string // reference matching's Shared
	}{
		{name: "key and value as declared", entries: entries("source_cluster", "proxy", "destination_cluster", "mock"), ref: 1, strict: 1},
		{name: "the value's underscore moved into the key", entries: entries("source_cluster", "proxy", "destination", "cluster_mock"), ref: 1},
		{name: "a key without a value reached by key and value", entries: entries("one_per", "minute"), ref: 1},
		{name: "the key alone as declared", entries: entries("one_per_minute", "x"), ref: 1, strict: 1},
		{name: "a wildcard reached across the join", entries: entries("files_no", "share/X1"), ref: 3, shared: []string{"share/*"}},
		{name: "a wildcard as declared", entries: entries("files", "no_share/X1"), ref: 3, strict: 3, shared: []string{"no_share/*"}},
		{name: "an empty value takes the key's", entries: entries("tenant", ""), ref: 9, strict: 9},
		{name: "a split anywhere in the first entry", entries: entries("source", "cluster_proxy", "destination_cluster", "mock"), ref: 1},
		{name: "a different string", entries: entries("source_cluster", "proxy", "destination_cluster", "mock_"), strict: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rpu := func(m Match) uint32 {
				if m.Limit == nil {
					return 0
				}
				return m.Limit.RequestsPerUnit
			}
			m := ref.Lookup("rl", tt.entries)
			require.Equal(t, tt.ref, rpu(m), "reference matching")
			require.Equal(t, tt.shared, m.Shared)
			require.Equal(t, tt.strict, rpu(strict.Lookup("rl", tt.entries)), "strict matching")
		})
	}
}

// TestJoinedCollisionRefused: two descriptors of one level that join to
// one string are refused as the reference refuses them, in both matching
// modes, across merged documents too.
func TestJoinedCollisionRefused(t *testing.T) {
	a, err := Parse("a.yaml", []byte("domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	require.NoError(t, err)
	b, err := Parse("b.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	require.NoError(t, err)
	for _, opts := range [][]Option{nil, {StrictMatch()}} {
		_, err = Compile([]*Document{a, b}, true, opts...)
		require.ErrorContains(t, err, `b.yaml:3: descriptor d.a_b: key "a" value "b" collides with key "a_b" value "": envoyproxy/ratelimit matches the joined string "a_b"`)
	}
	_, err = Parse("c.yaml", []byte("domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	require.ErrorContains(t, err, "duplicate descriptor")
}
