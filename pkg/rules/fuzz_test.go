package rules

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func FuzzNormalizePath(f *testing.F) {
	for _, seed := range []string{
		"", "/", "*", "//admin", "/%2Fadmin", "/%2fadmin", "/a/../admin", "/./admin",
		"/../../admin", "/admin%2F..%2Fsecret", "/admin?x=1", "/%", "/%2", "/%zz",
		"/%2e%2e/%2e%2e/etc/passwd", "..", "/a//b///c/./d/../e/", "/caf%C3%A9?q#f",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := NormalizePath(raw)
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("NormalizePath(%q) = %q: no leading slash", raw, got)
		}
		if got != "/" && strings.HasSuffix(got, "/") {
			t.Fatalf("NormalizePath(%q) = %q: trailing slash", raw, got)
		}
		for _, seg := range strings.Split(got[1:], "/") {
			if got != "/" && (seg == "" || seg == "." || seg == "..") {
				t.Fatalf("NormalizePath(%q) = %q: segment %q survived", raw, got, seg)
			}
		}
		if len(got) > len(raw)+1 {
			t.Fatalf("NormalizePath(%q) = %q: grew", raw, got)
		}
	})
}

func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("../../examples/rules.yaml"); err == nil {
		f.Add(string(data))
	}
	for _, seed := range []string{
		"", "version: 1\nrules: []\n", fullRule, matchRules, versionBase,
		"version: 1\nrules:\n  - {id: a, disabled: true}\n",
		"version: 1\nrules:\n  - {id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1s, foo: 1}\n",
		"version: 1\nrules:\n  - &a {id: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s}\n  - {<<: *a, id: b}\n",
		"version: 2\n", "- a\n", "---\n---\n", "version: 1\nrules: [\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, src string) {
		doc, err := Parse([]byte(src))
		if err != nil {
			return
		}
		v := Version(doc)
		s, err := Compile(doc)
		if err != nil {
			t.Fatalf("Parse accepted a document Compile rejects: %v\n%s", err, src)
		}
		if s.Version() != v {
			t.Fatalf("Snapshot.Version %s != Version %s", s.Version(), v)
		}
		// A parsed document marshals back to one with the same meaning.
		out, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of marshaled document failed: %v\n%s", err, out)
		}
		if Version(again) != v {
			t.Fatalf("version changed across a marshal round trip\n%s", out)
		}
	})
}
