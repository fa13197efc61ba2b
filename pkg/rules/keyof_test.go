package rules_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// KeyOf gives the key Match gives a request carrying the same values.
func TestKeyOfIsMatchsKey(t *testing.T) {
	s, err := rules.Load([]byte(`version: 1
rules:
  - {id: k, key: [ip, "header:X-Api-Key", "query:q", host], algorithm: fixed_window, limit: 1, window: 1m}
`), rules.WithKeySalt([]byte("salt")))
	require.NoError(t, err)
	req := rules.Request{
		Host: "a.example", Method: "GET", Path: "/", ClientIP: netip.MustParseAddr("2001:db8::1"),
		Header: func(n string) (string, bool) { return "key1", n == "X-Api-Key" },
		Query:  func(n string) (string, bool) { return "shoes", n == "q" },
	}
	ms := s.Match(&req, nil)
	require.Len(t, ms, 1)
	key, err := s.KeyOf("k", []string{"2001:db8::ffff", "key1", "shoes", "a.example"}) // the same /64
	require.NoError(t, err)
	require.Equal(t, ms[0].Key, key)
	other, err := s.KeyOf("k", []string{"2001:db8::1", "key2", "shoes", "a.example"})
	require.NoError(t, err)
	require.NotEqual(t, key, other)

	_, err = s.KeyOf("k", []string{"2001:db8::1"})
	require.ErrorContains(t, err, "keyed by 4 values")
	_, err = s.KeyOf("k", []string{"2001:db8::1", "", "shoes", "a.example"})
	require.ErrorContains(t, err, "derives no key")
	_, err = s.KeyOf("nope", nil)
	require.ErrorContains(t, err, "no rule nope")
}
