package region

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitParts(t *testing.T) {
	l := NewLayout("p/")
	var b strings.Builder
	for i := 0; b.Len() < 3*PartSize+1000; i++ {
		fmt.Fprintf(&b, "  - {id: cust-%06d, match: {hosts: [shop-%06d.example.net]}}\n", i, i)
	}
	doc := []byte(b.String())
	m, chunks := l.splitParts(doc)
	require.Len(t, m.Parts, 4)
	require.Equal(t, len(doc), m.Size)
	require.Equal(t, doc, bytes.Join(chunks, nil))
	for i, p := range m.Parts {
		require.LessOrEqual(t, p.Size, PartSize)
		require.True(t, bytes.HasSuffix(chunks[i], []byte("\n")), "part %d ends at a line end", i)
		require.Equal(t, "p/parts/"+p.SHA256, p.Key)
		require.Equal(t, sha256Hex(chunks[i]), p.SHA256)
	}

	// The manifest is recognized, and tells whether it holds a document.
	m.Version = "0123456789ab"
	data, err := json.Marshal(m)
	require.NoError(t, err)
	got, err := ParseManifest(data)
	require.NoError(t, err)
	require.Equal(t, &m, got)
	require.True(t, SameDocument(string(data), doc))
	require.False(t, SameDocument(string(data), append(bytes.Clone(doc), '\n')))

	// A document is not a manifest, even one in JSON.
	for _, v := range []string{"version: 1\nrules: []\n", `{"version": 1, "rules": []}`, ""} {
		got, err := ParseManifest([]byte(v))
		require.NoError(t, err)
		require.Nil(t, got)
		require.True(t, SameDocument(v, []byte(v)))
	}
	_, err = ParseManifest([]byte(`{"kind":"edgeguard-rules-parts/v1","parts":[]}`))
	require.Error(t, err)
	_, err = ParseManifest([]byte(`{"kind":"edgeguard-rules-parts/v1",`))
	require.Error(t, err)
}

// Manifests that cannot name a document are refused before anything is
// allocated for them, with ErrInvalidManifest.
func TestParseManifestBounds(t *testing.T) {
	h := strings.Repeat("ab", 32)
	part := func(size int) string {
		return fmt.Sprintf(`{"key":"edgeguard/parts/%s","size":%d,"sha256":"%s"}`, h, size, h)
	}
	manifest := func(size int, parts ...string) string {
		return fmt.Sprintf(`{"kind":"edgeguard-rules-parts/v1","version":"v","size":%d,"sha256":"%s","parts":[%s]}`, size, h, strings.Join(parts, ","))
	}
	for _, tc := range []struct{ name, value string }{
		{"size -1 (issue 24)", manifest(-1, part(10))},
		{"size 0", manifest(0, part(10))},
		{"size beyond MaxDocument", manifest(MaxDocument+1, part(10))},
		{"size beyond int", `{"kind":"edgeguard-rules-parts/v1","size":1e30,"sha256":"` + h + `","parts":[` + part(10) + `]}`},
		{"part size -1", manifest(10, part(-1))},
		{"part size beyond PartSize", manifest(PartSize+1, part(PartSize+1))},
		{"sizes do not add up", manifest(11, part(10))},
		{"too many parts", manifest(10*(MaxParts+1), strings.Split(strings.Repeat(part(10)+"|", MaxParts+1), "|")[:MaxParts+1]...)},
		{"bad document hash", strings.Replace(manifest(10, part(10)), `"sha256":"`+h+`","parts"`, `"sha256":"zz","parts"`, 1)},
		{"bad part hash", fmt.Sprintf(`{"kind":"edgeguard-rules-parts/v1","size":10,"sha256":"%s","parts":[{"key":"edgeguard/parts/x","size":10,"sha256":"x"}]}`, h)},
		{"part key not named by its hash", fmt.Sprintf(`{"kind":"edgeguard-rules-parts/v1","size":10,"sha256":"%s","parts":[{"key":"edgeguard/secret","size":10,"sha256":"%s"}]}`, h, h)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseManifest([]byte(tc.value))
			require.ErrorIs(t, err, ErrInvalidManifest)
			require.Nil(t, m)
		})
	}
	m, err := ParseManifest([]byte(manifest(20, part(10), part(10))))
	require.NoError(t, err)
	require.Len(t, m.Parts, 2)
}
