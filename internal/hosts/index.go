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
	// paths is the policy of the hosts the table does not name.
	paths PathPolicy
}

type entry struct {
	pattern string
	host    Host
	paths   PathPolicy // host.Paths resolved
}

// Index builds the lookup of the table's valid entries (a table from Parse
// is valid; of an invalid one, the entries that do not normalise are left
// out), their path policies resolved over the table's defaults over the
// zero PathPolicy (rfc3986, nothing refused, the path forwarded as sent).
func (t *Table) Index() *Index { return t.IndexOver(PathPolicy{}) }

// IndexOver is Index with base (the edge's flags) under the table's
// defaults.
func (t *Table) IndexOver(base PathPolicy) *Index {
	def := t.DefaultPaths(base)
	ix := &Index{exact: map[string]entry{}, wild: map[string]entry{}, paths: def}
	for p, h := range t.normalizedHosts() {
		e := entry{pattern: p, host: h, paths: h.over(def)}
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			ix.wild[suffix] = e
			ix.longest = max(ix.longest, len(suffix))
		} else {
			ix.exact[p] = e
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
	if e, found := ix.find(host); found {
		return e.pattern, e.host, true
	}
	return "", Host{}, false
}

// Route is Lookup for the request path: host's entry and the pattern that
// names it (ok false: none, the host goes to DefaultPool) and its path
// policy, the table's default one for a host it does not name. It
// allocates nothing.
func (ix *Index) Route(host string) (pattern string, h Host, paths PathPolicy, ok bool) {
	if e, found := ix.find(host); found {
		return e.pattern, e.host, e.paths, true
	}
	if ix == nil {
		return "", Host{}, PathPolicy{}, false
	}
	return "", Host{}, ix.paths, false
}

func (ix *Index) find(host string) (entry, bool) {
	if ix == nil || host == "" || len(host) > maxHostLen {
		return entry{}, false
	}
	if e, found := ix.exact[host]; found {
		return e, true
	}
	if len(ix.wild) == 0 {
		return entry{}, false
	}
	// Suffixes from the longest: what follows each dot that ends a
	// non-empty label.
	for i := max(1, len(host)-ix.longest-1); i < len(host); i++ {
		if host[i] != '.' || host[i-1] == '.' {
			continue
		}
		if e, found := ix.wild[host[i+1:]]; found {
			return e, true
		}
	}
	return entry{}, false
}
