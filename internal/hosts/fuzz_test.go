package hosts

import (
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// FuzzParseLookup: Parse never panics and either refuses a document with
// problems or returns a table whose every pattern is normalised and finds
// itself, and whose lookups of any host are consistent with the table.
func FuzzParseLookup(f *testing.F) {
	f.Add([]byte(example), "a.b.shop.example.com")
	f.Add([]byte("version: 1\nhosts:\n  \"*.a.com\": {pool: default}\n  b.a.com: {pool: default}\n"), "x.b.a.com")
	f.Add([]byte("version: 1\nhosts:\n  \"[::1]\": {pool: default}\n"), "[::1]:443")
	f.Add([]byte("version: 1\nhosts:\n  \"*.*.x\": {pool: default}\n"), "a.b.x")
	f.Add([]byte("version: 1\nhosts: {\"\\0\": {pool: default}}\n"), "\x00")
	f.Add([]byte("- 1\n"), "")
	f.Fuzz(func(t *testing.T, doc []byte, host string) {
		tb, err := Parse(doc)
		if err != nil {
			if len(Problems(err)) == 0 {
				t.Fatalf("an error without problems: %v", err)
			}
			return
		}
		if tb.Validate() != nil {
			t.Fatalf("Parse returned an invalid table: %v", tb.Validate())
		}
		ix := tb.Index()
		if ix.Len() != len(tb.Hosts) {
			t.Fatalf("index of %d entries for %d hosts", ix.Len(), len(tb.Hosts))
		}
		for p := range tb.Hosts {
			if n, err := NormalizePattern(p); err != nil || n != p {
				t.Fatalf("pattern %q not normalised (%q, %v)", p, n, err)
			}
			if strings.HasPrefix(p, "*.") {
				p = "x" + p[1:]
			}
			if got, _, ok := ix.Lookup(p); !ok || !matches(got, p) {
				t.Fatalf("lookup of %q: %q, %v", p, got, ok)
			}
		}
		h := rules.NormalizeHost(host)
		got, entry, ok := ix.Lookup(h)
		if !ok {
			if _, exact := tb.Hosts[h]; exact {
				t.Fatalf("%q is in the table but not found", h)
			}
			return
		}
		if tb.Hosts[got] != entry || !matches(got, h) {
			t.Fatalf("lookup of %q gave %q %+v", h, got, entry)
		}
		if _, exact := tb.Hosts[h]; exact && got != h {
			t.Fatalf("%q: a wildcard %q beat the exact entry", h, got)
		}
	})
}

func matches(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
	}
	return pattern == host
}
