package rules

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A document decoded in pieces is the document, with the same problems at
// the same lines, that it is decoded as one piece; a piece that does not
// parse on its own makes it one piece.
func TestPiecesLikeWhole(t *testing.T) {
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	defer runtime.GOMAXPROCS(prev)
	n := 200
	for _, tc := range []struct {
		name   string
		src    string
		pieces bool // decoded in pieces
	}{
		{"flow items", bigRules("version: 1\nrules:\n", "", n, flowItem), true},
		{"block items, comments, version last", bigRules("# rules\nrules:\n", "# end\nversion: 1\n", n, blockItem), true},
		{"document start marker", bigRules("---\nversion: 1\nrules:\n", "", n, flowItem), true},
		{"behaviour section after the list", bigRules("version: 1\nrules:\n", "behaviour: {mode: shadow}\n", n, flowItem), true},
		{"merge keys within an item", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			return fmt.Sprintf("  - {<<: &d%d {key: [ip], algorithm: fixed_window, limit: 5, window: 1s}, id: s%d}\n", i, i)
		}), true},
		{"each item aliasing the one before", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			return fmt.Sprintf("  - {id: s%d, key: [ip], algorithm: fixed_window, limit: &l%d 5, window: 1s, cost: *l%d}\n", i, i, max(0, i-1))
		}), false}, // every cut falls between an anchor and its alias
		{"problems in several pieces", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			if i%37 == 5 {
				return fmt.Sprintf("  - {id: s%d, key: [ip], algorithm: fixed_window, limit: 0, window: 1s, colour: red}\n", i)
			}
			return flowItem(i)
		}), true},
		{"repeated id across pieces", bigRules("version: 1\nrules:\n  - {id: site150, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", "", n, flowItem), true},
		{"alias across pieces", bigRules("version: 1\nrules:\n  - &first {id: s, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", "", n, func(i int) string {
			return fmt.Sprintf("  - {<<: *first, id: s%d, match: {hosts: [customer-%d.example.com]}}\n", i, i)
		}), false},
		{"second document after the list", bigRules("version: 1\nrules:\n", "---\nversion: 1\n", n, flowItem), false},
		{"item that does not parse", bigRules("version: 1\nrules:\n", "  - {id: bad, limit: [}\n", n, flowItem), false},
		{"version 2", bigRules("version: 2\nrules:\n", "", n, flowItem), false},
		{"no version", bigRules("rules:\n", "", n, flowItem), false},
		{"version twice", bigRules("version: 1\nrules:\n", "version: 1\n", n, flowItem), true},
		{"rules twice", bigRules("version: 1\nrules:\n", "rules: []\n", n, flowItem), false},
		{"unknown top-level key after the list", bigRules("version: 1\nrules:\n", "extra: 1\n", n, flowItem), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.src)
			defer func(was int) { pieceSize = was }(pieceSize)
			pieceSize = len(data) + 1
			wholeDoc, wholeErr := Parse(data)
			pieceSize = len(data) / 8
			cuts := splitRules(data)
			require.NotNil(t, cuts)
			_, _, decoded := decodePieces(data, cuts)
			require.Equal(t, tc.pieces, decoded, "decoded in pieces")
			doc, err := Parse(data)
			require.Equal(t, wholeDoc, doc)
			if wholeErr != nil {
				require.EqualError(t, err, wholeErr.Error())
			}
		})
	}
}

// forgetPieces empties the pieces remembered, as a process that has parsed
// nothing yet: for tests and benchmarks of a first load.
func forgetPieces() {
	seen.mu.Lock()
	defer seen.mu.Unlock()
	clear(seen.known)
}

// A document parsed again after an edit takes the pieces the edit did not
// reach from memory, and is the document parsed afresh; what a caller does
// to a document it was given never reaches a later parse; and a piece no
// recent parse held is forgotten.
func TestPiecesRemembered(t *testing.T) {
	n := 400
	base := bigRules("version: 1\nrules:\n", "", n, flowItem)
	defer func(was int) { pieceSize = was }(pieceSize)
	pieceSize = len(base) / 16
	pieces := len(splitRules([]byte(base)))
	require.Greater(t, pieces, 8)
	parse := func(src string) (doc *Document, hits, misses int) {
		h, m := seen.hits, seen.misses
		doc, err := Parse([]byte(src))
		require.NoError(t, err)
		return doc, seen.hits - h, seen.misses - m
	}
	fresh := func(src string) *Document {
		forgetPieces()
		doc, _, _ := parse(src)
		return doc
	}
	for _, tc := range []struct {
		name    string
		src     string
		reached int // pieces the edit reaches, at most
	}{
		{"unchanged", base, 0},
		{"one limit changed", strings.Replace(base, flowItem(200), strings.Replace(flowItem(200), "limit: 100", "limit: 7", 1), 1), 2},
		{"a rule inserted near the top", strings.Replace(base, flowItem(3), flowItem(3)+flowItem(1000), 1), 2},
		{"a rule removed", strings.Replace(base, flowItem(300), "", 1), 2},
		{"a comment added", strings.Replace(base, flowItem(100), "  # moved here\n"+flowItem(100), 1), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := fresh(tc.src)
			fresh(base)
			doc, hits, misses := parse(tc.src)
			require.Equal(t, want, doc)
			require.LessOrEqual(t, misses, tc.reached, "pieces parsed")
			require.Equal(t, len(splitRules([]byte(tc.src)))-1, hits+misses, "every piece but the first is looked up")
		})
	}
	t.Run("callers' changes stay theirs", func(t *testing.T) {
		want := fresh(base)
		for range 3 { // a document made of parsed pieces, then of remembered ones
			doc, _, _ := parse(base)
			for i := range doc.Rules {
				r := &doc.Rules[i]
				r.Key[0], r.Limit = "header:x-evil", 1
				if len(r.Match.Hosts) > 0 {
					r.Match.Hosts[0] = "evil.example"
				}
			}
		}
		doc, hits, _ := parse(base)
		require.Equal(t, pieces-1, hits)
		require.Equal(t, want, doc)
	})
	t.Run("forgotten after two parses without it", func(t *testing.T) {
		other := func(k int) string {
			return bigRules("version: 1\nrules:\n", "", n, func(i int) string { return flowItem(i + (k+1)*n) })
		}
		fresh(base)
		parse(other(0)) // as an edge's other document
		_, hits, _ := parse(base)
		require.Equal(t, pieces-1, hits)
		parse(other(1))
		parse(other(2))
		_, hits, misses := parse(base)
		require.Zero(t, hits)
		require.Equal(t, pieces-1, misses)
		require.LessOrEqual(t, len(seen.known), 3*pieces, "pieces remembered")
	})
}

// Parses of documents that share pieces, at once, each get their own
// document, the one parsed alone (run with -race).
func TestPiecesRememberedConcurrently(t *testing.T) {
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	defer runtime.GOMAXPROCS(prev)
	base := bigRules("version: 1\nrules:\n", "", 400, flowItem)
	defer func(was int) { pieceSize = was }(pieceSize)
	pieceSize = len(base) / 16
	srcs := []string{base, strings.Replace(base, flowItem(200), "", 1)}
	var want []*Document
	for _, src := range srcs {
		forgetPieces()
		doc, err := Parse([]byte(src))
		require.NoError(t, err)
		want = append(want, doc)
	}
	var wg sync.WaitGroup
	got := make([][]*Document, 4)
	for g := range got {
		wg.Go(func() {
			for i := range 6 {
				doc, err := Parse([]byte(srcs[(g+i)%2]))
				if err == nil {
					for k := range doc.Rules { // what a caller may do
						doc.Rules[k].Key[0] = "ip"
					}
				}
				got[g] = append(got[g], doc)
			}
		})
	}
	wg.Wait()
	for g := range got {
		for i, doc := range got[g] {
			w := *want[(g+i)%2]
			w.Rules = slices.Clone(w.Rules)
			for k := range w.Rules {
				w.Rules[k].Key = append([]string{"ip"}, w.Rules[k].Key[1:]...)
			}
			require.Equal(t, &w, doc, "parse %d of goroutine %d", i, g)
		}
	}
}
