package rules

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// keyCacheDoc has two rules whose inputs are the same bytes (their keys
// differ by prefix only) and one keyed by a header as well.
const keyCacheDoc = `version: 1
rules:
  - {id: a, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: b, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}
  - {id: c, key: [ip, "header:X-API-Key"], algorithm: sliding_log, limit: 10, window: 10s}
`

// uncached is s without its key cache: every key hashed, as the cache
// must give it.
func uncached(s *Snapshot) *Snapshot {
	ref := *s
	ref.keys = nil
	return &ref
}

func keyCacheRequest(i int, apiKey string) *Request {
	return &Request{
		Host: "example.com", Method: "GET", Path: "/",
		ClientIP: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
		Header: func(name string) (string, bool) {
			if name == "X-Api-Key" {
				return apiKey, true
			}
			return "", false
		},
	}
}

// The cache gives every key that hashing gives, across many more inputs
// than it has slots (slots taken over and over, two rules with equal
// inputs landing in one slot now and then), inputs too long to keep, and
// a second pass over all of them.
func TestKeyCacheGivesTheKeysHashingGives(t *testing.T) {
	s := mustCompile(t, mustParse(t, keyCacheDoc), WithKeySalt([]byte("salt")))
	ref := uncached(s)
	long := strings.Repeat("k", maxCachedInput+40)
	var got, want []Match
	for pass := range 2 {
		for i := range 20 * keyCacheSlots {
			apiKey := "key"
			if i%7 == 0 {
				// Too long to keep; two of them share the first
				// maxCachedInput+40 bytes.
				apiKey = long + string(rune('a'+i%3))
			}
			got = s.Match(keyCacheRequest(i, apiKey), got[:0])
			want = ref.Match(keyCacheRequest(i, apiKey), want[:0])
			require.Len(t, got, 3)
			for j := range want {
				if got[j].Key != want[j].Key {
					t.Fatalf("pass %d, client %d, rule %s: key %q, hashing gives %q", pass, i, want[j].Rule.ID, got[j].Key, want[j].Key)
				}
			}
		}
	}
	// Many rules with equal inputs: each gets its own key.
	var many strings.Builder
	many.WriteString("version: 1\nrules:\n")
	for i := range 300 {
		fmt.Fprintf(&many, "  - {id: r%d, key: [ip], algorithm: sliding_log, limit: 10, window: 10s}\n", i)
	}
	s2 := mustCompile(t, mustParse(t, many.String()), WithKeySalt([]byte("salt")))
	ref2 := uncached(s2)
	for range 2 {
		for i := range 50 {
			got = s2.Match(keyCacheRequest(i, ""), got[:0])
			want = ref2.Match(keyCacheRequest(i, ""), want[:0])
			require.Len(t, got, 300)
			for j := range want {
				if got[j].Key != want[j].Key {
					t.Fatalf("client %d, rule %s: key %q, hashing gives %q", i, want[j].Rule.ID, got[j].Key, want[j].Key)
				}
			}
		}
	}
	// Another salt, another snapshot: other keys for the same request.
	other := mustCompile(t, mustParse(t, keyCacheDoc), WithKeySalt([]byte("pepper")))
	require.NotEqual(t, s.Match(keyCacheRequest(1, "key"), nil)[0].Key, other.Match(keyCacheRequest(1, "key"), nil)[0].Key)
}
