package rules

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMerge(t *testing.T) {
	global := mustParse(t, `
version: 1
rules:
  - {id: b-override, key: [ip], algorithm: sliding_log, limit: 100, window: 1m}
  - {id: c-disable, key: [ip], algorithm: fixed_window, limit: 10, window: 1s}
  - {id: a-keep, key: [host], algorithm: sliding_window, limit: 5, window: 1s}
`)
	region := mustParse(t, `
version: 1
rules:
  - {id: b-override, key: [ip], algorithm: token_bucket, limit: 50, window: 1m, scope: pop}
  - {id: c-disable, disabled: true}
  - {id: z-no-global, disabled: true}
  - {id: d-region-only, key: [method], algorithm: sliding_log, limit: 1, window: 1s}
`)
	got, err := Merge(global, region)
	require.NoError(t, err)

	ids := make([]string, len(got.Rules))
	for i, r := range got.Rules {
		ids[i] = r.ID
	}
	require.Equal(t, []string{"a-keep", "b-override", "d-region-only"}, ids, "sorted by id, disabled ones gone")
	require.EqualValues(t, "token_bucket", got.Rules[1].Algorithm, "region replaces the whole rule")
	require.Equal(t, int64(50), got.Rules[1].Limit)
	require.Equal(t, ScopePoP, got.Rules[1].Scope)
	require.Equal(t, 1, got.Version)

	// Inputs are untouched and the result is deterministic.
	require.Len(t, global.Rules, 3)
	again, err := Merge(global, region)
	require.NoError(t, err)
	require.Equal(t, got, again)
	require.Equal(t, Version(got), Version(again))
}

func TestMergeNil(t *testing.T) {
	global := mustParse(t, "version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1s}\n")

	got, err := Merge(global, nil)
	require.NoError(t, err)
	require.Len(t, got.Rules, 1)

	got, err = Merge(nil, global)
	require.NoError(t, err)
	require.Len(t, got.Rules, 1)

	got, err = Merge(nil, nil)
	require.NoError(t, err)
	require.Empty(t, got.Rules)
}

func TestMergeGlobalDisabledRule(t *testing.T) {
	global := &Document{Version: 1, Rules: []Rule{validRule("a"), {ID: "off", Disabled: true}}}
	got, err := Merge(global, nil)
	require.NoError(t, err)
	require.Len(t, got.Rules, 1)
	require.Equal(t, "a", got.Rules[0].ID)
}

func TestMergeReportsBothDocuments(t *testing.T) {
	g := validRule("g")
	g.Limit = 0
	r := validRule("r")
	r.Window = 0
	_, err := Merge(&Document{Version: 1, Rules: []Rule{g}}, &Document{Version: 1, Rules: []Rule{r}})
	require.ErrorContains(t, err, "global document")
	require.ErrorContains(t, err, `rule "g": limit`)
	require.ErrorContains(t, err, "region document")
	require.ErrorContains(t, err, `rule "r": window`)
}

// TestEffective holds Effective, which validates each document once, to
// what Parse, Merge and Compile give, which validate each document three
// times: the same document, the same snapshot, the same errors' documents.
func TestEffective(t *testing.T) {
	global := `
version: 1
behaviour: {mode: shadow}
rules:
  - {id: b-override, match: {methods: [get], hosts: [WWW.Example.COM]}, key: [ip], algorithm: sliding_log, limit: 100, window: 1m}
  - {id: c-disable, key: [ip], algorithm: fixed_window, limit: 10, window: 1s}
  - {id: a-keep, match: {path_prefix: [/api//v1/]}, key: [host], algorithm: sliding_window, limit: 5, window: 1s}
`
	region := `
version: 1
rules:
  - {id: b-override, key: [ip], algorithm: token_bucket, limit: 50, window: 1m, scope: pop}
  - {id: c-disable, disabled: true}
  - {id: z-no-global, disabled: true}
  - {id: d-region-only, match: {methods: [post, GET]}, key: [method], algorithm: sliding_log, limit: 1, window: 1s}
`
	regionBehaviour := "version: 1\nbehaviour: {mode: enforce}\nrules: []\n"
	large := hostRulesYAML(2 * parallelValidate) // validated in pieces
	for _, tc := range []struct{ name, global, region string }{
		{"both", global, region},
		{"a region's behaviour section", global, regionBehaviour},
		{"no region document", global, ""},
		{"no global document", "", region},
		{"blank documents", " \n", "\n\n"},
		{"large", string(large), region},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []CompileOption{WithKeySalt([]byte("salt")), WithIPv6Prefix(56)}
			snap, doc, err := Effective([]byte(tc.global), []byte(tc.region), opts...)
			require.NoError(t, err)

			parse := func(text string) *Document {
				if strings.TrimSpace(text) == "" {
					return nil
				}
				return mustParse(t, text)
			}
			want, err := Merge(parse(tc.global), parse(tc.region))
			require.NoError(t, err)
			require.Equal(t, want, doc)
			wantSnap := mustCompile(t, want, opts...)
			require.Equal(t, wantSnap.Version(), snap.Version())
			require.Equal(t, wantSnap.Rules(), snap.Rules())
			require.Equal(t, wantSnap.Behaviour(), snap.Behaviour())
			req := &Request{Host: "www.example.com", Method: "GET", Path: "/api/v1/x", ClientIP: netip.MustParseAddr("2001:db8::1")}
			require.Equal(t, wantSnap.Match(req, nil), snap.Match(req, nil))
		})
	}

	t.Run("errors name their document", func(t *testing.T) {
		bad := "version: 1\nrules:\n  - {id: x, key: [ip], algorithm: sliding_log, limit: 0, window: 1s}\n"
		_, _, err := Effective([]byte(bad), []byte(region))
		require.ErrorContains(t, err, `global document: rules: invalid document:`)
		require.ErrorContains(t, err, `rule "x": limit`)
		_, _, err = Effective([]byte(global), []byte(bad))
		require.ErrorContains(t, err, `region document: rules: invalid document:`)
		_, _, err = Effective([]byte(global), []byte("version: 1\nrules: [\n"))
		require.ErrorContains(t, err, "region document: rules: invalid document:")
		_, _, err = Effective([]byte(global), nil, WithIPv6Prefix(0))
		require.ErrorContains(t, err, "IPv6 prefix must be 1-128 bits")
	})
}
