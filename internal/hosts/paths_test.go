package hosts

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/pathsem"
)

const pathsTable = `version: 1
defaults:
  path_semantics: servlet
  refuse_ambiguous_paths: true
hosts:
  iis.example.com:
    pool: default
    path_semantics: case-insensitive+windows
    refuse_ambiguous_paths: false
  "*.java.example.com": {pool: default, forward_normalized_path: true}
  plain.example.com: {pool: default, path_semantics: rfc3986}
`

func TestPathPolicies(t *testing.T) {
	tb, err := Parse([]byte(pathsTable))
	require.NoError(t, err)
	flags := PathPolicy{Semantics: pathsem.CaseInsensitive, ForwardNormalized: false}
	ix := tb.IndexOver(flags)
	for _, tc := range []struct {
		host  string
		named bool
		want  PathPolicy
	}{
		// Every field its own, over the defaults.
		{"iis.example.com", true, PathPolicy{Semantics: pathsem.CaseInsensitive | pathsem.Windows}},
		// The defaults' semantics and refusal, its own forwarding.
		{"a.java.example.com", true, PathPolicy{Semantics: pathsem.Servlet, RefuseAmbiguous: true, ForwardNormalized: true}},
		{"plain.example.com", true, PathPolicy{Semantics: pathsem.RFC3986, RefuseAmbiguous: true}},
		// Not in the table: the defaults over the flags.
		{"other.example.com", false, PathPolicy{Semantics: pathsem.Servlet, RefuseAmbiguous: true}},
	} {
		t.Run(tc.host, func(t *testing.T) {
			_, _, got, ok := ix.Route(tc.host)
			require.Equal(t, tc.named, ok)
			require.Equal(t, tc.want, got)
		})
	}

	// No defaults: the flags' policy for every host that sets nothing.
	tb, err = Parse([]byte("version: 1\nhosts:\n  a.example.com: {pool: default}\n"))
	require.NoError(t, err)
	_, _, got, _ := tb.IndexOver(flags).Route("a.example.com")
	require.Equal(t, flags, got)
	_, _, got, _ = tb.IndexOver(flags).Route("b.example.com")
	require.Equal(t, flags, got)
	// A nil index (no table) is the zero policy: rfc3986.
	var none *Index
	_, _, got, ok := none.Route("a.example.com")
	require.False(t, ok)
	require.Equal(t, PathPolicy{}, got)

	// The settings are part of the table's meaning.
	a, err := Parse([]byte(pathsTable))
	require.NoError(t, err)
	b, err := Parse([]byte(pathsTable + "  more.example.com: {pool: default}\n"))
	require.NoError(t, err)
	c, err := Parse([]byte(strings.Replace(pathsTable, "refuse_ambiguous_paths: true", "refuse_ambiguous_paths: false", 1)))
	require.NoError(t, err)
	require.NotEqual(t, a.Version(), b.Version())
	require.NotEqual(t, a.Version(), c.Version())
}

func TestPathSettingsValidated(t *testing.T) {
	_, err := Parse([]byte(`version: 1
defaults:
  path_semantics: nginx
hosts:
  a.example.com:
    pool: default
    path_semantics: servlet+servlet
  b.example.com: {pool: default, path_semantic: servlet}
  c.example.com: {pool: default, refuse_ambiguous_paths: "yes please"}
`))
	require.Error(t, err)
	var got []string
	for _, p := range Problems(err) {
		got = append(got, p.Error())
	}
	require.Equal(t, []string{
		`line 3: defaults.path_semantics: path semantics "nginx": unknown path semantics "nginx" (want rfc3986, servlet, case-insensitive, windows, joined by '+')`,
		`line 7: hosts."a.example.com".path_semantics: path semantics "servlet+servlet": "servlet" given twice`,
		`line 8: hosts."b.example.com".path_semantic: unknown field "path_semantic"`,
		`line 9: hosts."c.example.com".refuse_ambiguous_paths: cannot unmarshal !!str ` + "`yes please`" + ` into bool`,
	}, got)
}
