package region

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// FuzzDocuments feeds the readers what a Consul key of a region can hold —
// a rules document, a manifest of parts (with part as every part's
// value), shedder settings — as an edge reads them: the manifest parsed,
// its parts resolved, the rules parsed and merged, the shedder settings
// parsed. None may panic; a manifest is either refused with
// ErrInvalidManifest or bounded, and a resolved document is exactly the
// one the manifest names.
func FuzzDocuments(f *testing.F) {
	l := NewLayout("")
	seedManifest := func(doc []byte) {
		m, chunks := l.splitParts(doc)
		m.Version = "0123456789ab"
		data, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, chunks[0])
	}
	examples, _ := filepath.Glob("../../examples/rules*.yaml")
	for _, path := range examples {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, []byte(nil))
		seedManifest(data)
	}
	for _, doc := range []string{
		"version: 1\nrules:\n  - id: per-ip\n    key: [ip]\n    algorithm: fixed_window\n    limit: 2\n    window: 1h\n",
		"version: 1\nrules:\n  - id: per-ip\n    disabled: true\n",
		"version: 1\nrules: []\n",
	} {
		f.Add([]byte(doc), []byte(nil))
		seedManifest([]byte(doc))
	}
	// The manifest of issue 24, and neighbours.
	h := strings.Repeat("e3", 32)
	for _, size := range []string{"-1", "0", "9223372036854775807", "1e30", "10"} {
		f.Add([]byte(`{"kind":"edgeguard-rules-parts/v1","version":"0123456789ab","size":`+size+
			`,"sha256":"`+h+`","parts":[{"key":"edgeguard/parts/`+h+`","size":10,"sha256":"`+h+`"}]}`), []byte("0123456789"))
	}
	f.Add([]byte(`{"kind":"edgeguard-rules-parts/v1","parts":[]}`), []byte(nil))
	f.Add([]byte(`{"kind":"edgeguard-rules-parts/v1",`), []byte(nil))
	for _, s := range []string{`{"good": 0.65, "bad": 0.85}`, `{"enabled": false}`, `{}`, `{"good": 0.9, "bad": 0.8}`} {
		f.Add([]byte(s), []byte(nil))
	}

	c := &Client{layout: l}
	f.Fuzz(func(t *testing.T, value, part []byte) {
		m, err := ParseManifest(value)
		switch {
		case err != nil:
			if !errors.Is(err, ErrInvalidManifest) || m != nil {
				t.Fatalf("ParseManifest: %v, %v: a refusal is ErrInvalidManifest, with no manifest", m, err)
			}
		case m != nil:
			if m.Size < 1 || m.Size > MaxDocument || len(m.Parts) < 1 || len(m.Parts) > MaxParts {
				t.Fatalf("ParseManifest accepted size %d in %d parts", m.Size, len(m.Parts))
			}
			total := 0
			for _, p := range m.Parts {
				if p.Size < 1 || p.Size > PartSize {
					t.Fatalf("ParseManifest accepted a part of %d bytes", p.Size)
				}
				total += p.Size
			}
			if total != m.Size {
				t.Fatalf("ParseManifest accepted parts of %d bytes for a document of %d", total, m.Size)
			}
		}

		doc, rerr := c.resolve("eu-west", value, func(i, n int, key string) ([]byte, error) { return part, nil })
		switch {
		case err != nil && rerr == nil:
			t.Fatalf("resolve read a manifest ParseManifest refused: %v", err)
		case rerr == nil && m != nil:
			sum := sha256.Sum256(doc)
			if len(doc) != m.Size || hex.EncodeToString(sum[:]) != m.SHA256 {
				t.Fatalf("resolve returned %d bytes that are not the document the manifest names", len(doc))
			}
		case rerr == nil && !bytes.Equal(doc, value):
			t.Fatal("resolve changed a document that is not a manifest")
		}
		if rerr == nil {
			_, _, _ = rules.Effective(doc, nil)
			_, _, _ = rules.Effective(nil, doc)
		}
		_, _ = shedder.ParseConfig(value)
	})
}
