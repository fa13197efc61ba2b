package rules

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadIsParseThenCompile holds Load to what Parse and Compile give:
// the same rules and version, the same errors.
func TestLoadIsParseThenCompile(t *testing.T) {
	// Host rules in eight pieces: the parse of a large document.
	docs := map[string]string{"host rules": string(hostRulesYAML(400))}
	defer func(was int) { pieceSize = was }(pieceSize)
	pieceSize = len(docs["host rules"]) / 8
	for name, src := range pinnedDocuments {
		docs[name] = src
	}
	for name, src := range docs {
		t.Run(name, func(t *testing.T) {
			want := mustCompile(t, mustParse(t, src), WithIPv6Prefix(48))
			got, err := Load([]byte(src), WithIPv6Prefix(48))
			require.NoError(t, err)
			require.Equal(t, want.Version(), got.Version())
			require.Equal(t, want.IPv6Prefix(), got.IPv6Prefix())
			require.Equal(t, want.Rules(), got.Rules())
		})
	}
	bad := "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: 0, window: 1s}\n"
	_, parseErr := Parse([]byte(bad))
	_, err := Load([]byte(bad))
	require.EqualError(t, err, parseErr.Error())
	_, err = Load([]byte(pinnedDocuments["every field, token bucket"]), WithIPv6Prefix(0))
	require.ErrorContains(t, err, "IPv6 prefix must be 1-128 bits")
}
