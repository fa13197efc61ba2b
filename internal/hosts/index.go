package hosts

import "strings"

// maxHostLen is the longest host name; exact entries and wildcard
// suffixes are no longer.
const maxHostLen = 253

// Index is a table ready for lookups: read-only, safe for concurrent use.
type Index struct {
	exact map[string]entry // by name
	wild  map[string]entry // by the suffix after "*."
	// longest is the length of the longest suffix in wild: shorter
	// suffixes of a host are all Lookup tries, so a long Host header
	// of many labels costs no more than a valid name.
	longest int
}

type entry struct {
	pattern string
	host    Host
}

// Index builds the lookup of the table's valid entries (a table from Parse
// is valid; of an invalid one, the entries that do not normalise are left
// out).
func (t *Table) Index() *Index {
	ix := &Index{exact: map[string]entry{}, wild: map[string]entry{}}
	for p, h := range t.normalizedHosts() {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			ix.wild[suffix] = entry{pattern: p, host: h}
			ix.longest = max(ix.longest, len(suffix))
		} else {
			ix.exact[p] = entry{pattern: p, host: h}
		}
	}
	return ix
}

// Len is the number of entries.
func (ix *Index) Len() int {
	if ix == nil {
		return 0
	}
	return len(ix.exact) + len(ix.wild)
}

// Lookup finds host's entry: host as rules.NormalizeHost returns it. An
// exact entry wins; else the wildcard with the longest suffix:
// "*.example.com" matches "a.example.com" and "a.b.example.com" but not
// "example.com". ok is false when nothing matches: the host goes to
// DefaultPool, as does a host longer than a name can be (253 characters).
// It allocates nothing, and costs at most one map lookup per label of the
// longest wildcard, whatever the size of the table or of host.
func (ix *Index) Lookup(host string) (pattern string, h Host, ok bool) {
	if ix == nil || host == "" || len(host) > maxHostLen {
		return "", Host{}, false
	}
	if e, found := ix.exact[host]; found {
		return e.pattern, e.host, true
	}
	if len(ix.wild) == 0 {
		return "", Host{}, false
	}
	// Suffixes from the longest: what follows each dot that ends a
	// non-empty label.
	for i := max(1, len(host)-ix.longest-1); i < len(host); i++ {
		if host[i] != '.' || host[i-1] == '.' {
			continue
		}
		if e, found := ix.wild[host[i+1:]]; found {
			return e.pattern, e.host, true
		}
	}
	return "", Host{}, false
}
