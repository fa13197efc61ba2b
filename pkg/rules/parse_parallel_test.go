package rules

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// bigRules is a document over parallelMin: n host rules, with head and tail.
func bigRules(head, tail string, n int, item func(i int) string) string {
	var b strings.Builder
	b.WriteString(head)
	for i := range n {
		b.WriteString(item(i))
	}
	b.WriteString(tail)
	return b.String()
}

func flowItem(i int) string {
	return fmt.Sprintf("  - {id: site%d, match: {hosts: [site%d.example.com], path_prefix: [/api]}, key: [ip, host], algorithm: token_bucket, limit: 100, window: 1s}\n", i, i)
}

func blockItem(i int) string {
	return fmt.Sprintf("  # customer %d\n  - id: site%d\n    match:\n      hosts: [site%d.example.com]\n    key: [ip]\n    algorithm: sliding_window\n    limit: %d\n    window: 1m\n\n", i, i, i, i+1)
}

// The pieces parsed concurrently must join into what one parse gives, and
// anything a piece cannot parse alone must fall back to one parse.
func TestParseParallelEqualsSerial(t *testing.T) {
	defer func(was, rules int) { parallelMin, parallelRules = was, rules }(parallelMin, parallelRules)
	parallelMin, parallelRules = 16<<10, 64
	prev := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))) // the split needs two CPUs
	defer runtime.GOMAXPROCS(prev)
	n := 600
	for _, tc := range []struct {
		name     string
		src      string
		parallel bool // the split applies
	}{
		{"flow items", bigRules("version: 1\nrules:\n", "", n, flowItem), true},
		{"block items, comments, version last", bigRules("# rules\nrules:\n", "# end\nversion: 1\n", n, blockItem), true},
		{"anchors within a piece", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			if i%2 == 0 {
				return fmt.Sprintf("  - &r%d {id: s%d, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", i, i)
			}
			return fmt.Sprintf("  - {<<: *r%d, id: s%d}\n", i-1, i)
		}), true},
		{"alias across pieces", bigRules("version: 1\nrules:\n  - &first {id: s, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", "", n, func(i int) string {
			return fmt.Sprintf("  - {<<: *first, id: s%d, match: {hosts: [customer-%d.example.com]}}\n", i, i)
		}), false},
		{"second document after the list", bigRules("version: 1\nrules:\n", "---\nversion: 1\n", n, flowItem), false},
		{"item that does not parse", bigRules("version: 1\nrules:\n", "  - {id: bad, limit: [}\n", n, flowItem), false},
		{"wrong type", bigRules("version: 1\nrules:\n", "  - {id: bad, limit: lots}\n", n, flowItem), true},
		{"unknown field", bigRules("version: 1\nrules:\n", "  - {id: bad, colour: red}\n", n, flowItem), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.src)
			require.Greater(t, len(data), parallelMin)
			root := parseTreeParallel(data)
			require.Equal(t, tc.parallel, root != nil)
			serial, serialErr := parseTreeSerial(data)
			if root == nil {
				_, err := Parse(data)
				if serialErr != nil {
					require.Error(t, err)
					return
				}
				// The rules can still be decoded in pieces of the one tree,
				// aliases across pieces included.
				want, wantErrs := referenceDecode(t, tc.src)
				require.Nil(t, wantErrs)
				var got Document
				require.NoError(t, decodeTree(serial, &got))
				require.Equal(t, *want, got)
				return
			}
			require.NoError(t, serialErr)
			var a, b Document
			errA, errB := root.Decode(&a), serial.Decode(&b)
			require.Equal(t, errB, errA)
			require.Equal(t, b, a)
			// Decoding the rules in pieces gives what the strict decoder
			// gives: the same document (costs defaulted), the same errors.
			want, wantErrs := referenceDecode(t, tc.src)
			var c Document
			errC := decodeTree(root, &c)
			if wantErrs != nil {
				require.ElementsMatch(t, wantErrs, errC.(*yaml.TypeError).Errors)
				return // Parse returns no document then
			}
			require.NoError(t, errC)
			require.Equal(t, *want, c)
			require.Equal(t, unknownFields(serial, documentType, nil), unknownFields(root, documentType, nil))
			require.Equal(t, lastLine(serial), lastLine(root), "node lines as in the whole text")
		})
	}
}

func lastLine(root *yaml.Node) int {
	seq := rulesOf(root)
	return seq.Content[len(seq.Content)-1].Line
}

// A large document parsed and decoded piece by piece is the document the
// whole parse gives; anything the pieces cannot do alone, or not by hand,
// goes the whole way.
func TestParsePiecesEqualsWhole(t *testing.T) {
	defer func(was, size int) { parallelMin, pieceSize = was, size }(parallelMin, pieceSize)
	parallelMin, pieceSize = 8<<10, 2<<10
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
		{"merge keys within a piece", bigRules("version: 1\nrules:\n", "", n, func(i int) string {
			if i%2 == 0 {
				return fmt.Sprintf("  - &r%d {id: s%d, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", i, i)
			}
			return fmt.Sprintf("  - {<<: *r%d, id: s%d}\n", i-1, i)
		}), false},
		{"alias across pieces", bigRules("version: 1\nrules:\n  - &first {id: s, key: [ip], algorithm: fixed_window, limit: 5, window: 1s}\n", "", n, func(i int) string {
			return fmt.Sprintf("  - {<<: *first, id: s%d, match: {hosts: [customer-%d.example.com]}}\n", i, i)
		}), false},
		{"second document after the list", bigRules("version: 1\nrules:\n", "---\nversion: 1\n", n, flowItem), false},
		{"item that does not parse", bigRules("version: 1\nrules:\n", "  - {id: bad, limit: [}\n", n, flowItem), false},
		{"unknown field", bigRules("version: 1\nrules:\n", "  - {id: bad, colour: red}\n", n, flowItem), false},
		{"hex number", bigRules("version: 1\nrules:\n", "  - {id: odd, key: [ip], limit: 0x10}\n", n, flowItem), false},
		{"version 2", bigRules("version: 2\nrules:\n", "", n, flowItem), false},
		{"no version", bigRules("rules:\n", "", n, flowItem), false},
		{"version twice", bigRules("version: 1\nrules:\n", "version: 1\n", n, flowItem), false},
		{"rules twice", bigRules("version: 1\nrules:\n", "rules: []\n", n, flowItem), false},
		{"unknown top-level key after the list", bigRules("version: 1\nrules:\n", "extra: 1\n", n, flowItem), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.src)
			require.Greater(t, len(data), 4*pieceSize)
			got := parsePieces(data)
			require.Equal(t, tc.pieces, got != nil)
			want, err := parseWhole(data)
			if got == nil {
				return
			}
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Len(t, got.Rules, n)
		})
	}
}
