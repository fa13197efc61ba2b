package region

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A manifest is read as strictly as the other JSON documents: a field in
// another case or given twice is an invalid manifest (the rules in force
// stay), not one whose last "size" wins.
func TestParseManifestStrict(t *testing.T) {
	h := strings.Repeat("e3", 32)
	part := `{"key":"edgeguard/parts/` + h + `","size":10,"sha256":"` + h + `"}`
	good := `{"kind":"edgeguard-rules-parts/v1","version":"0123456789ab","size":10,"sha256":"` + h + `","parts":[` + part + `]}`
	m, err := ParseManifest([]byte(good))
	require.NoError(t, err)
	require.Equal(t, 10, m.Size)
	for name, c := range map[string]struct{ doc, want string }{
		"a field in another case": {strings.Replace(good, `"sha256":"`+h+`","parts"`, `"SHA256":"`+h+`","parts"`, 1), `unknown field "SHA256"`},
		"a field twice":           {strings.Replace(good, `"size":10,`, `"size":10,"size":20,`, 1), `field "size" given twice`},
		"an unknown field":        {strings.Replace(good, `"size":10,`, `"size":10,"sizes":20,`, 1), `unknown field "sizes"`},
		"a part's field in case":  {strings.Replace(good, `{"key":`, `{"Key":`, 1), `parts[0]: unknown field "Key"`},
	} {
		_, err := ParseManifest([]byte(c.doc))
		require.ErrorIs(t, err, ErrInvalidManifest, name)
		require.ErrorContains(t, err, c.want, name)
	}
}
