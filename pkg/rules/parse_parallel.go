package rules

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// parallelMin is the document size from which parseTree splits the rules
// list and parses the pieces concurrently: YAML parsing is most of what a
// large rule set costs to load. A variable for tests.
var parallelMin = 1 << 20

// parseTreeParallel parses a large document whose rules are a block
// sequence under a top-level "rules:" line in pieces, one per CPU, and joins
// the trees. Each piece is parsed as "rules:" plus whole list items, after
// as many blank lines as it is down the document, so node lines stay right.
// It returns nil whenever the document is not of that shape or a piece does
// not parse on its own (an alias to an anchor in another piece, an error):
// the caller then parses the whole text, which gives the reference result
// and every error message.
func parseTreeParallel(data []byte) *yaml.Node {
	n := runtime.GOMAXPROCS(0)
	if len(data) < parallelMin || n < 2 {
		return nil
	}
	cuts := splitRules(data, n)
	if cuts == nil {
		return nil
	}
	pieces := make([][]byte, n)
	for k, c := range cuts {
		if k == 0 {
			pieces[k] = data[:c.to]
			continue
		}
		head := make([]byte, 0, c.line+len("rules:\n")+c.to-c.from)
		head = append(head, bytes.Repeat([]byte("\n"), c.line-1)...)
		head = append(head, "rules:\n"...)
		pieces[k] = append(head, data[c.from:c.to]...)
	}
	roots := make([]*yaml.Node, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			if root, err := parseTreeSerial(pieces[k]); err == nil {
				roots[k] = root
			}
		})
	}
	wg.Wait()
	first := rulesOf(roots[0])
	if first == nil {
		return nil
	}
	for _, r := range roots[1:] {
		seq := rulesOf(r)
		if seq == nil || len(seq.Content) == 0 {
			return nil
		}
		first.Content = append(first.Content, seq.Content...)
		for i := 0; i+1 < len(r.Content); i += 2 {
			if r.Content[i+1] != seq {
				roots[0].Content = append(roots[0].Content, r.Content[i], r.Content[i+1])
			}
		}
	}
	return roots[0]
}

// pieceSize is about how much text parsePieces parses at a time. A
// variable for tests.
var pieceSize = 512 << 10

// parsePieces parses and decodes a large document of the plain shape piece
// by piece: one worker per CPU takes pieces of about pieceSize in turn,
// parses it and decodes its rules by hand (parse_fast.go) at once. A
// piece's tree is garbage as soon as its rules are decoded, so the heap
// holds the rules and a few small trees instead of the tree of the whole
// document, which for 100,000 rules is hundreds of megabytes for the
// collector to scan and the kernel to fault in. It returns nil whenever
// that is not possible (the document is small or not of that shape, a
// piece does not parse on its own or is not of the plain shape, the version
// is not SchemaVersion); Parse then takes the general path, which gives the
// same document or every error message.
func parsePieces(data []byte) *Document {
	n := runtime.GOMAXPROCS(0)
	if len(data) < parallelMin {
		return nil
	}
	count := max(n, len(data)/pieceSize)
	cuts := splitRules(data, count)
	if cuts == nil {
		return nil
	}
	rules := make([][]Rule, count)
	heads := make([][]*yaml.Node, count) // each piece's top-level keys but rules
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range min(n, count) {
		wg.Go(func() {
			for !failed.Load() {
				k := int(next.Add(1) - 1)
				if k >= count {
					return
				}
				c := cuts[k]
				var r io.Reader = bytes.NewReader(data[c.from:c.to])
				if k > 0 {
					r = io.MultiReader(strings.NewReader("rules:\n"), r)
				}
				root, err := parseTreeReader(r)
				seq := rulesOf(root)
				ok := err == nil && seq != nil
				if ok {
					rules[k], ok = fastRules(seq.Content)
				}
				if !ok {
					failed.Store(true)
					return
				}
				for i := 0; i+1 < len(root.Content); i += 2 {
					if root.Content[i+1] != seq {
						heads[k] = append(heads[k], root.Content[i], root.Content[i+1])
					}
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return nil
	}
	head := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Tag: "!!str", Value: "rules"}, {Kind: yaml.SequenceNode, Tag: "!!seq"},
	}}
	for _, h := range heads {
		head.Content = append(head.Content, h...)
	}
	doc := &Document{}
	if _, ok := fastHead(head, doc); !ok || doc.Version != SchemaVersion {
		return nil
	}
	doc.Rules = slices.Concat(rules...)
	return doc
}

// cut is one piece of a document's text: bytes [from, to), starting at
// line (0-based). The first piece starts at 0 and carries everything before
// the rules list, the last everything after it.
type cut struct{ from, to, line int }

// splitRules cuts a document whose rules are a block sequence under a
// top-level "rules:" line into count pieces of whole list items, or returns
// nil when the document is not of that shape or has fewer than two items
// per piece.
func splitRules(data []byte, count int) []cut {
	// Find the "rules:" line, the item indentation and where the items end.
	lines := lineStarts(data)
	start := -1
	for i := range lines {
		if string(bytes.TrimRight(lineAt(data, lines, i), " \r")) == "rules:" {
			start = i
			break
		}
	}
	if start < 0 {
		return nil
	}
	indent := -1
	var items []int // line numbers (0-based) of item starts
	for i := start + 1; i < len(lines); i++ {
		l := lineAt(data, lines, i)
		t := bytes.TrimLeft(l, " ")
		if len(t) == 0 || t[0] == '#' || t[0] == '\r' {
			continue
		}
		ind := len(l) - len(t)
		if ind == 0 {
			break // the next top-level key, or "---"
		}
		if indent < 0 {
			indent = ind
		}
		if ind == indent && (bytes.HasPrefix(t, []byte("- ")) || bytes.Equal(bytes.TrimRight(t, " \r"), []byte("-"))) {
			items = append(items, i)
		}
	}
	if len(items) < 2*count {
		return nil
	}
	offset := func(line int) int {
		if line >= len(lines) {
			return len(data)
		}
		return lines[line]
	}
	cuts := make([]cut, count)
	for k := range count {
		line := items[k*len(items)/count]
		cuts[k] = cut{from: offset(line), to: len(data), line: line}
		if k > 0 {
			cuts[k-1].to = cuts[k].from
		}
	}
	cuts[0].from, cuts[0].line = 0, 0
	return cuts
}

// rulesOf is the block sequence under root's one "rules" key (nil if none,
// or not exactly one, or not a plain block sequence).
func rulesOf(root *yaml.Node) *yaml.Node {
	if root == nil || root.Kind != yaml.MappingNode {
		return nil
	}
	var seq *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "rules" {
			if seq != nil {
				return nil
			}
			seq = root.Content[i+1]
		}
	}
	if seq == nil || seq.Kind != yaml.SequenceNode || seq.Style&yaml.FlowStyle != 0 || seq.Anchor != "" {
		return nil
	}
	return seq
}

func lineStarts(data []byte) []int {
	starts := make([]int, 1, bytes.Count(data, []byte("\n"))+1)
	for i, c := range data {
		if c == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	return starts
}

func lineAt(data []byte, starts []int, i int) []byte {
	end := len(data)
	if i+1 < len(starts) {
		end = starts[i+1] - 1
	}
	return data[starts[i]:end]
}

// parallelRules is the rule count from which decodeTree decodes the rules
// in one piece per CPU. A variable for tests.
var parallelRules = 4096

// decodeTree decodes root into doc as yaml.v3's strict decoder would, cost
// defaulted (see defaultCost): the rules by hand where they are of the plain
// shape (parse_fast.go), the rest by yaml.v3, with the unknown fields found
// on the tree (unknownFields). The rules of a large document are decoded in
// one piece per CPU; the pieces are nodes of the one tree, so aliases and
// merge keys resolve as in one decode.
func decodeTree(root *yaml.Node, doc *Document) error {
	seq, ok := fastHead(root, doc)
	if !ok {
		// Not a plain top level: all of it by yaml.v3.
		err := root.Decode(doc)
		if unknown := unknownFields(root, documentType, nil); len(unknown) > 0 {
			err = mergeTypeErrors(err, unknown)
		}
		if err == nil {
			defaultCost(root, doc)
		}
		return err
	}
	if seq == nil {
		return nil
	}
	n := runtime.GOMAXPROCS(0)
	if len(seq.Content) < parallelRules {
		n = 1
	}
	rules := make([][]Rule, n)
	errs := make([]error, n)
	decode := func(k int) {
		items := seq.Content[k*len(seq.Content)/n : (k+1)*len(seq.Content)/n]
		var ok bool
		if rules[k], ok = fastRules(items); !ok {
			rules[k], errs[k] = decodeRules(items)
		}
	}
	if n == 1 {
		decode(0)
	} else {
		var wg sync.WaitGroup
		for k := range n {
			wg.Go(func() { decode(k) })
		}
		wg.Wait()
	}
	doc.Rules = slices.Concat(rules...)
	if doc.Rules == nil {
		doc.Rules = []Rule{} // an empty list, as yaml.v3 decodes it
	}
	var msgs []string
	for _, err := range errs {
		var te *yaml.TypeError
		switch {
		case err == nil:
		case errors.As(err, &te):
			msgs = append(msgs, te.Errors...)
		default:
			return err
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	slices.SortStableFunc(msgs, func(a, b string) int { return cmp.Compare(lineOf(a), lineOf(b)) })
	return &yaml.TypeError{Errors: msgs}
}

var rulesType = reflect.TypeFor[[]Rule]()

// decodeRules decodes rule nodes by yaml.v3, unknown fields included, with
// omitted costs defaulted.
func decodeRules(items []*yaml.Node) ([]Rule, error) {
	piece := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: items}
	var rules []Rule
	err := piece.Decode(&rules)
	if unknown := unknownFields(piece, rulesType, nil); len(unknown) > 0 {
		err = mergeTypeErrors(err, unknown)
	}
	if err != nil {
		return nil, err
	}
	var costs []struct {
		Cost *int64 `yaml:"cost"`
	}
	if piece.Decode(&costs) != nil || len(costs) != len(rules) {
		return rules, nil // the strict decode succeeded; this cannot really happen
	}
	for i, c := range costs {
		if c.Cost == nil {
			rules[i].Cost = 1
		}
	}
	return rules, nil
}
