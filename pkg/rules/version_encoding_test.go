package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// versionByJSON is Version's definition: encoding/json over canonicalRule
// with the list strings Go-quoted. canonicalVersion must give the same.
func versionByJSON(d *Document, withDisabled bool) string {
	quote := func(s []string) []string {
		out := make([]string, len(s))
		for i, v := range s {
			out[i] = strconv.Quote(v)
		}
		return out
	}
	rules := canonicalRules(d, withDisabled)
	for i := range rules {
		r := &rules[i]
		if !r.Disabled {
			r.Hosts, r.PathPrefix, r.Methods, r.Key = quote(r.Hosts), quote(r.PathPrefix), quote(r.Methods), quote(r.Key)
		}
	}
	slices.SortStableFunc(rules, func(a, b canonicalRule) int { return cmp.Compare(a.ID, b.ID) })
	data, err := json.Marshal(struct {
		Schema int             `json:"schema"`
		Rules  []canonicalRule `json:"rules"`
	}{SchemaVersion, rules})
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:versionLen]
}

// The hand-written encoding hashes exactly what encoding/json writes, for
// any strings (escapes, HTML characters, non-UTF-8 bytes, U+2028), any
// numbers, repeated ids and disabled rules.
func TestVersionEncodingLikeJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	alphabet := []string{"a", "Z", "0", ".", "-", "/", "*", "\"", "\\", "<", ">", "&", "\x00", "\n", "\t", "\x7f", "\xff", "é", "\u2028", "€", " ", "%2F", ":"}
	str := func() string {
		var s string
		for range rng.IntN(6) {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	list := func() []string {
		switch rng.IntN(4) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		out := make([]string, 1+rng.IntN(3))
		for i := range out {
			out[i] = str()
		}
		return out
	}
	for i := range 300 {
		d := &Document{Version: SchemaVersion}
		for range rng.IntN(12) {
			d.Rules = append(d.Rules, Rule{
				ID:          []string{"a", "b", "c", str()}[rng.IntN(4)],
				Match:       MatchSpec{Hosts: list(), PathPrefix: list(), Methods: list()},
				Key:         list(),
				Algorithm:   Algorithm([]string{"token_bucket", "sliding_log", "fixed_window", str()}[rng.IntN(4)]),
				Limit:       rng.Int64N(1000) - 10,
				Window:      Duration(rng.Int64()),
				Burst:       rng.Int64N(50) - 5,
				Cost:        rng.Int64N(4),
				MinInterval: Duration(rng.Int64N(1e9)),
				Shadow:      rng.IntN(2) == 0,
				Scope:       Scope(str()),
				Disabled:    rng.IntN(5) == 0,
			})
		}
		for _, withDisabled := range []bool{false, true} {
			require.Equal(t, versionByJSON(d, withDisabled), canonicalVersion(d, withDisabled), "document %d, disabled %t: %+v", i, withDisabled, d)
		}
	}
	// And the documents the other tests use, normalized as Version sees them.
	for _, src := range []string{versionBase, fullRule, benchRules, matchRules, string(hostRulesYAML(30))} {
		d := mustParse(t, src)
		require.Equal(t, versionByJSON(d, false), Version(d))
		require.Equal(t, versionByJSON(d, true), DocumentVersion(d))
	}
}
