package hosts

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// scaleDoc is a document of n hosts over three pools: host i is
// h<i>.shop.example.com (every tenth a wildcard, *.w<i>.shop.example.com)
// in pool p<i%3>. The first host entry is on line 9.
func scaleDoc(n int) string {
	var b strings.Builder
	b.WriteString("version: 1\npools:\n  p0: {urls: [\"http://10.0.0.1:80\"]}\n  p1: {urls: [\"http://10.0.0.2:80\"]}\n  p2: {urls: [\"http://10.0.0.3:80\"]}\n")
	b.WriteString("defaults: {path_semantics: rfc3986}\n# every host of the shop\nhosts:\n")
	for i := range n {
		fmt.Fprintf(&b, "  %s: {pool: p%d}\n", scaleHost(i), i%3)
	}
	return b.String()
}

func scaleHost(i int) string {
	if i%10 == 9 {
		return fmt.Sprintf("\"*.w%d.shop.example.com\"", i)
	}
	return fmt.Sprintf("h%d.shop.example.com", i)
}

// The largest table the limits allow (a smaller one under -race, see
// race_test.go) parses whole, every host to its pool. yaml.v3 decoding the
// hosts mapping itself took minutes at 100,000 hosts (it compares every key
// with every later one); the test's own timeout is the bound.
func TestParseAtScale(t *testing.T) {
	doc := scaleDoc(scaleHosts)
	require.LessOrEqual(t, len(doc), MaxDocumentSize)
	tb, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.Len(t, tb.Hosts, scaleHosts)
	ix := tb.Index()
	for _, i := range []int{0, 1, 2, 9, scaleHosts / 2, scaleHosts - 2, scaleHosts - 1} {
		name := strings.Trim(scaleHost(i), `"`)
		if i%10 == 9 {
			name = "a.b" + name[1:]
		}
		pattern, e, ok := ix.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, fmt.Sprintf("p%d", i%3), e.Pool, name)
		require.Equal(t, strings.Trim(scaleHost(i), `"`), pattern)
	}
	_, _, ok := ix.Lookup(fmt.Sprintf("h%d.shop.example.com", scaleHosts))
	require.False(t, ok)

	// The cap on the size is what 100,000 entries of 80 bytes take.
	require.LessOrEqual(t, len("version: 1\nhosts:\n")+MaxHosts*80, MaxDocumentSize)
}

// Problems at scale keep their lines and paths, and a table with a problem
// on every host is read (and refused) in linear time too.
func TestProblemsAtScale(t *testing.T) {
	const n = 10000
	last := 9 + n - 1 // the line of the last host
	base := scaleDoc(n)
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"repeated host", base + "  h7.shop.example.com: {pool: p0}\n",
			[]string{fmt.Sprintf(`line %d: hosts."h7.shop.example.com".pool: mapping key "h7.shop.example.com" already defined at line 16`, last+1)}},
		{"repeated host, quoted", base + "  \"h7.shop.example.com\": {pool: p0}\n",
			[]string{fmt.Sprintf(`line %d: hosts."h7.shop.example.com".pool: mapping key "h7.shop.example.com" already defined at line 16`, last+1)}},
		{"the same host once normalised", base + "  H7.Shop.Example.Com.: {pool: p0}\n",
			[]string{fmt.Sprintf(`line 16: hosts."h7.shop.example.com": the same host as "H7.Shop.Example.Com." (line %d): both are "h7.shop.example.com"`, last+1)}},
		{"unknown field in the last entry", base + "  last.example.com: {pool: p0, weight: 3}\n",
			[]string{fmt.Sprintf(`line %d: hosts."last.example.com".weight: unknown field "weight"`, last+1)}},
		{"wrong type in the last entry", base + "  last.example.com: {pool: [p0]}\n",
			[]string{
				fmt.Sprintf(`line %d: hosts."last.example.com".pool: cannot unmarshal !!seq into string`, last+1),
				fmt.Sprintf(`line %d: hosts."last.example.com".pool: required: one of the table's pools or "default"`, last+1),
			}},
		{"unknown pool in the last entry", base + "  last.example.com: {pool: p9}\n",
			[]string{fmt.Sprintf(`line %d: hosts."last.example.com".pool: unknown pool "p9" (pools: default, p0, p1, p2)`, last+1)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, problemsOf(t, tc.doc))
		})
	}
	t.Run("a problem on every host", func(t *testing.T) {
		got := problemsOf(t, strings.ReplaceAll(base, "{pool: p", "{pool: q"))
		require.Len(t, got, n)
		require.Equal(t, `line 9: hosts."h0.shop.example.com".pool: unknown pool "q0" (pools: default, p0, p1, p2)`, got[0])
		require.Equal(t, fmt.Sprintf(`line %d: hosts."*.w%d.shop.example.com".pool: unknown pool "q%d" (pools: default, p0, p1, p2)`, last, n-1, (n-1)%3), got[n-1])
	})
}

// A document is refused before yaml.v3 decodes a mapping it would take
// quadratic time over, and merge keys (whose only use is with aliases) are
// refused with them.
func TestHostileMappings(t *testing.T) {
	many := func(indent string, n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "%sk%d: 1\n", indent, i)
		}
		return b.String()
	}
	tests := []struct{ name, doc, want string }{
		{"pools", "version: 1\npools:\n" + many("  ", 5000), "line 3: pools: a mapping of 5000 keys, at most 512"},
		{"top level", "version: 1\n" + many("", 5000), "line 1: a mapping of 5001 keys, at most 512"},
		{"in a host entry", "version: 1\nhosts:\n  a.com:\n    pool: default\n" + many("    ", 5000), `line 4: hosts."a.com": a mapping of 5001 keys, at most 512`},
		{"in a host's field", "version: 1\nhosts:\n  a.com:\n    pool:\n" + many("      ", 5000), `line 5: hosts."a.com".pool: a mapping of 5000 keys, at most 512`},
		{"merge key", "version: 1\nhosts:\n  a.com: {<<: {pool: default}}\n", "line 3: YAML merge keys (<<) are not allowed"},
		{"merge key in a pool", "version: 1\npools:\n  p:\n    <<: {urls: [\"http://o:80\"]}\n", "line 4: YAML merge keys (<<) are not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, []string{tc.want}, problemsOf(t, tc.doc))
		})
	}
	// At the bound a pools mapping is decoded, and Validate counts it.
	var b strings.Builder
	b.WriteString("version: 1\npools:\n")
	for i := range maxMappingKeys {
		fmt.Fprintf(&b, "  p%d: {urls: [\"http://o:80\"]}\n", i)
	}
	require.Equal(t, []string{"line 2: pools: 512 pools, at most 256"}, problemsOf(t, b.String()))
}

// BenchmarkParse parses a table of 4,000, 16,000 and 100,000 hosts: the
// time grows with the size, not its square.
func BenchmarkParse(b *testing.B) {
	for _, n := range []int{4000, 16000, MaxHosts} {
		doc := []byte(scaleDoc(n))
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := Parse(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
