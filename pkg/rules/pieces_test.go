package rules

import (
	"fmt"
	"runtime"
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
		{"merge keys within a piece", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			if i%2 == 0 {
				return fmt.Sprintf("  - &r%d {id: s%d, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", i, i)
			}
			return fmt.Sprintf("  - {<<: *r%d, id: s%d}\n", i-1, i)
		}), false}, // a cut falls between an anchor and its alias
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
			cuts := splitRules(data, len(data)/pieceSize)
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
