package rules

import (
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
