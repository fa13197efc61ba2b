package rules

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// A large document is parsed and decoded in pieces of whole rules, one
// worker per CPU: yaml.v3's node tree of 100,000 rules is hundreds of
// megabytes, most of the cost of a load, and a piece's tree is garbage as
// soon as its rules are decoded. The pieces go through the same parser and
// the same decoder as a whole document; only the text each parse sees is
// shorter. A piece is "rules:" and the list items of one stretch of the
// list, its nodes' lines moved to where they are in the document. When a
// piece does not parse on its own (an alias to an anchor in another piece,
// a syntax error, anything but a plain block list under one top-level
// "rules:"), the document is parsed as one piece, which gives the
// reference result and every error message.
//
// A piece that decoded without a problem is remembered by its text for the
// next parse that holds it (seen): an edge parses both of its region's
// documents on every change to either, and a change to a large document is
// usually a few rules. The cuts fall where the items' own text says
// (splitRules), so an edit moves only the cuts next to it, and the other
// pieces are copied from memory instead of parsed.

// pieceSize is about how much text one piece holds. A variable for tests.
var pieceSize = 512 << 10

// cut is one piece of a document's text: bytes [from, to), starting at
// line (0-based), holding the list items [first, first+items). The first
// piece starts at 0 and carries everything before the rules list, the last
// everything after it.
type cut struct{ from, to, line, first, items int }

// decodeText parses and decodes data: the document and its decode
// problems, or the error that leaves no document to decode (YAML syntax,
// empty, several documents, unsupported version).
// A document past its decoding budget or with too many rules is such an
// error (limits.go): what did decode is not worth validating.
func decodeText(data []byte) (*Document, []*FieldError, error) {
	if cuts := splitRules(data); cuts != nil {
		last := cuts[len(cuts)-1]
		if fe := tooManyRules(last.first+last.items, 0); fe != nil {
			return nil, nil, fmt.Errorf("rules: invalid document:\n%w", fe)
		}
		if doc, errs, ok := decodePieces(data, cuts); ok {
			return doc, errs, nil
		}
	}
	root, err := parseTree(data)
	if err != nil {
		return nil, nil, err
	}
	if err := checkVersion(root); err != nil {
		return nil, nil, err
	}
	doc, errs := decodeDocument(root, len(data))
	if i := slices.IndexFunc(errs, isTooLarge); i >= 0 {
		return nil, nil, fmt.Errorf("rules: invalid document:\n%w", errs[i])
	}
	return doc, errs, nil
}

// piece is what a worker made of one piece; its rules are decoded in
// place, into the document's list.
type piece struct {
	errs []*FieldError
	head []*yaml.Node // the top-level keys and values besides "rules"
	key  *yaml.Node   // the "rules" key, in the first piece
}

// decodePieces decodes data cut at cuts, or reports false when a piece
// does not parse on its own.
func decodePieces(data []byte, cuts []cut) (*Document, []*FieldError, bool) {
	pieces := make([]piece, len(cuts))
	parse := seen.begin()
	last := cuts[len(cuts)-1]
	rules := make([]Rule, last.first+last.items)
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(cuts)) {
		wg.Go(func() {
			for !failed.Load() {
				k := int(next.Add(1) - 1)
				if k >= len(cuts) {
					return
				}
				c := cuts[k]
				if !decodePiece(data, c, rules[c.first:c.first+c.items], &pieces[k], parse) {
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return nil, nil, false
	}
	// The top level: every key but the rules, and one empty "rules" in
	// place of the list, decoded as in a whole document.
	head := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1, Column: 1}
	for _, p := range pieces {
		if p.key != nil {
			head.Content = append(head.Content, p.key, &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: p.key.Line})
		}
		head.Content = append(head.Content, p.head...)
	}
	if checkVersion(head) != nil {
		return nil, nil, false // the whole parse says why
	}
	doc, errs := decodeDocument(head, len(data))
	if slices.ContainsFunc(errs, isTooLarge) {
		return nil, nil, false // the whole parse says why
	}
	for k, p := range pieces {
		for _, e := range p.errs {
			if e.Index >= 0 {
				e.Index += cuts[k].first
			}
		}
		errs = append(errs, p.errs...)
	}
	doc.Rules = rules
	return doc, errs, true
}

// decodePiece parses and decodes one piece into out (its rules, zero) and
// p, or reports false when the piece's list does not hold c.items rules.
// A piece after the first is copied from memory when seen holds its text.
func decodePiece(data []byte, c cut, out []Rule, p *piece, parse uint64) bool {
	text := data[c.from:c.to]
	first := c.from == 0
	var sum [sha256.Size]byte
	lines := 0
	if !first {
		sum = sha256.Sum256(text)
		if seen.get(sum, parse, out) {
			return true
		}
		// "rules:" on line 1, the items from line 2: the document's line
		// c.line+1 (1-based).
		text = slices.Concat([]byte(rulesField()+":\n"), text)
		lines = c.line - 1
	}
	root, err := parseTree(text)
	if err != nil {
		return false
	}
	key, seq := rulesOf(root)
	if seq == nil || len(seq.Content) != c.items {
		return false
	}
	shiftLines(root, lines)
	d := newDecoder(len(text))
	d.rules(seq.Content, out)
	if d.over {
		return false // the whole document's budget decides
	}
	p.errs = d.problems()
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i] != key {
			p.head = append(p.head, root.Content[i], root.Content[i+1])
		}
	}
	if first {
		p.key = key
	} else if len(p.errs) == 0 && len(p.head) == 0 {
		seen.put(sum, parse, out)
	}
	return true
}

// shiftLines moves the lines of n and of the nodes within it down by
// lines, to where they are in the document.
func shiftLines(n *yaml.Node, lines int) {
	if lines == 0 {
		return
	}
	n.Line += lines
	for _, c := range n.Content {
		shiftLines(c, lines)
	}
}

// pieceMemory is the pieces remembered, by the SHA-256 of their text,
// each with the parse (a count of documents decoded in pieces) that last
// held it. A piece that neither of the last keepParses parses held is
// forgotten: two documents parsed in turn, as an edge's global and region
// documents are, keep theirs, and memory holds about the rules of the
// documents in use.
type pieceMemory struct {
	mu           sync.Mutex
	parses       uint64
	known        map[[sha256.Size]byte]*knownPiece
	hits, misses int // pieces copied from memory, and parsed
}

type knownPiece struct {
	rules []Rule // never changed: copied in and out deep
	held  uint64
}

const keepParses = 2

var seen = pieceMemory{known: map[[sha256.Size]byte]*knownPiece{}}

// begin numbers a new parse and forgets the pieces no recent parse held.
func (m *pieceMemory) begin() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.parses++
	for sum, k := range m.known {
		if k.held+keepParses < m.parses {
			delete(m.known, sum)
		}
	}
	return m.parses
}

// get copies the rules of the piece with text sum into out, if known.
func (m *pieceMemory) get(sum [sha256.Size]byte, parse uint64, out []Rule) bool {
	m.mu.Lock()
	k := m.known[sum]
	if k != nil && len(k.rules) == len(out) {
		k.held = max(k.held, parse)
		m.hits++
	} else {
		k = nil
		m.misses++
	}
	m.mu.Unlock()
	if k == nil {
		return false
	}
	deepCopy(out, k.rules)
	return true
}

// put remembers a copy of the rules just decoded from the piece with text sum.
func (m *pieceMemory) put(sum [sha256.Size]byte, parse uint64, rules []Rule) {
	k := &knownPiece{rules: make([]Rule, len(rules)), held: parse}
	deepCopy(k.rules, rules)
	m.mu.Lock()
	m.known[sum] = k
	m.mu.Unlock()
}

// splitRules cuts a document of at least two pieceSize whose rules are a
// block sequence under a top-level "rules:" line into pieces of whole list
// items, or returns nil when it is smaller or not of that shape. A piece
// ends before an item once it holds half a pieceSize, where the hash of the
// item's first line picks it (on average a quarter to half a pieceSize
// further), or at twice pieceSize: the cuts depend on the text near them,
// not on where the list starts, so an edit leaves the cuts away from it
// where they were.
func splitRules(data []byte) []cut {
	if len(data) < 2*pieceSize {
		return nil
	}
	lines := lineStarts(data)
	start, key := -1, rulesField()+":"
	for i := range lines {
		if string(bytes.TrimRight(lineAt(data, lines, i), " \r")) == key {
			start = i
			break
		}
	}
	if start < 0 {
		return nil
	}
	// The item lines: "- " at the indentation of the first, up to the
	// next line at column 0 (the next top-level key, or "---").
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
			break
		}
		if indent < 0 {
			indent = ind
		}
		if ind == indent && (bytes.HasPrefix(t, []byte("- ")) || bytes.Equal(bytes.TrimRight(t, " \r"), []byte("-"))) {
			items = append(items, i)
		}
	}
	if len(items) < 2 {
		return nil
	}
	// A cut every so many items on average, so many as make half a piece,
	// rounded down to a power of two: adding or removing a rule seldom
	// changes it, and with it every cut.
	span := lines[items[len(items)-1]] - lines[items[0]]
	every := uint64(1) << (bits.Len(uint(max(1, pieceSize/2*(len(items)-1)/max(1, span)))) - 1)
	cuts := []cut{{}}
	for i := 1; i < len(items); i++ {
		size := lines[items[i]] - cuts[len(cuts)-1].from
		if size < pieceSize/2 || size < 2*pieceSize && lineHash(lineAt(data, lines, items[i]))%every != 0 {
			continue
		}
		c := &cuts[len(cuts)-1]
		c.to, c.items = lines[items[i]], i-c.first
		cuts = append(cuts, cut{from: c.to, line: items[i], first: i})
	}
	if len(cuts) < 2 {
		return nil
	}
	c := &cuts[len(cuts)-1]
	c.to, c.items = len(data), len(items)-c.first
	return cuts
}

// lineHash is FNV-1a: the same cuts in every process, so that a test
// can say which pieces an edit reaches.
func lineHash(line []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range line {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// rulesOf is root's one "rules" key and its value, a block sequence (nils
// if root has no such key, or more than one, or another value).
func rulesOf(root *yaml.Node) (key, seq *yaml.Node) {
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == rulesField() {
			if key != nil {
				return nil, nil
			}
			key, seq = root.Content[i], root.Content[i+1]
		}
	}
	if seq == nil || seq.Kind != yaml.SequenceNode || seq.Style&yaml.FlowStyle != 0 || seq.Anchor != "" {
		return nil, nil
	}
	return key, seq
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
