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
