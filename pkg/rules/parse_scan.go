package rules

import (
	"bytes"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// scanDocument decodes a rules document written in the subset of YAML that
// rule sets are written in, without building yaml.v3's node tree: at
// 100,000 rules that tree (a node per scalar, a token per character class)
// is most of what a load costs, and a line scanner that fills the rules
// directly is several times cheaper.
//
// The subset: a top-level block mapping at column 0 with "version" and
// "rules" once each, and at most one "behaviour" section (a few lines,
// decoded by yaml.v3: see section); rules as a block sequence (at the key's column or
// deeper) or a one-line flow sequence; each rule a block mapping starting
// on its "- " line or a one-line flow mapping; the rule's known fields once
// each, "match" again a block or one-line flow mapping, lists block
// sequences or one-line flow sequences; scalars plain or quoted on one line
// (no escapes), ints in plain decimal, bools spelled true or false,
// durations as strings; comments, blank lines, CRLF line ends and a leading
// "---". Anything else (an unknown or repeated key, anchors, aliases, tags,
// merge keys, block scalars, multi-line scalars or flow collections, tabs,
// a plain scalar yaml.v3 would read as anything but the type the field
// takes, a version other than SchemaVersion, ...) makes it return nil, and
// Parse takes the general path, yaml.v3's: the scanner only ever declines,
// it never reports an error, so every error message, and every document
// outside the subset, is decoded as before. A field or section this scanner
// does not know, added to Document or Rule, is therefore decoded by yaml.v3
// until the scanner learns it. TestScanLikeYAML, TestScanRandomLikeYAML
// and FuzzScanLikeYAML hold the two to the same documents.
func scanDocument(data []byte) *Document {
	s := &scanner{data: data}
	s.advance()
	if !s.eof && s.col == 0 && isMarker(s.text, "---") {
		s.advance()
	}
	doc := &Document{}
	var version, rules, behaviour bool
	for !s.bad {
		if s.eof {
			break
		}
		if s.col != 0 {
			return nil
		}
		key, rest, ok := mappingKey(s.text)
		if !ok {
			return nil
		}
		switch {
		case key == "version" && !version:
			version = true
			v, rest, ok := plainIntIn(skipSpaces(rest), false)
			if !ok || int64(int(v)) != v || !s.afterInline(rest, 0) {
				return nil
			}
			doc.Version = int(v)
		case key == "rules" && !rules:
			rules = true
			if doc.Rules, ok = s.rules(rest); !ok {
				return nil
			}
		case key == "behaviour" && !behaviour:
			behaviour = true
			if doc.Behaviour, ok = s.section(); !ok {
				return nil
			}
		default:
			return nil
		}
	}
	if s.bad || doc.Version != SchemaVersion {
		return nil
	}
	return doc
}

// section decodes the behaviour section, the top-level key on the current
// line and the lines below it up to the next top-level key, with yaml.v3
// (strictly, as the general path does): a few lines however many rules
// follow, so a rule set with a behaviour section keeps the scanner's speed.
// A section yaml.v3 refuses is declined, and the general path reports it.
func (s *scanner) section() (*behavior.Settings, bool) {
	from := s.at
	for s.advance(); !s.eof && s.col > 0; s.advance() {
	}
	to := len(s.data)
	if !s.eof {
		to = s.at
	}
	if s.bad {
		return nil, false
	}
	root, err := parseTreeSerial(s.data[from:to])
	if err != nil {
		return nil, s.fail()
	}
	var part Document
	if err := decodeTree(root, &part); err != nil || part.Behaviour == nil {
		return nil, s.fail()
	}
	return part.Behaviour, true
}

// scanner walks a document line by line. The current line's content starts
// at column col and is text (comment included, line break excluded);
// blank and comment-only lines are skipped. At the end eof is set and col
// is -1, below every block.
type scanner struct {
	data []byte
	at   int // offset of the current line
	next int // offset of the line after the current one
	col  int
	text []byte
	eof  bool
	bad  bool
	// interned holds values many rules repeat (algorithms, key
	// descriptors, path prefixes, methods, scopes), so 100,000 rules share
	// one "ip" instead of allocating 100,000.
	interned map[string]string
}

// advance moves to the next line with content.
func (s *scanner) advance() {
	for s.next < len(s.data) {
		start := s.next
		rest := s.data[s.next:]
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, s.next = rest[:i], s.next+i+1
		} else {
			s.next = len(s.data)
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		i := 0
		for i < len(line) && line[i] == ' ' {
			i++
		}
		switch {
		case i == len(line):
			continue // blank
		case line[i] == '#':
			if !commentOK(line[i:]) {
				s.bad, s.eof, s.col = true, true, -1
				return
			}
			continue
		}
		s.at, s.col, s.text = start, i, line[i:]
		return
	}
	s.eof, s.col, s.text = true, -1, nil
}

// fail marks the document as outside the subset.
func (s *scanner) fail() bool {
	s.bad = true
	return false
}

// afterInline moves past a line whose value ended on it (a scalar or a flow
// collection, rest is what follows it) and checks that the next line does
// not continue it: nothing may follow deeper than col, the column of the
// block the value belongs to.
func (s *scanner) afterInline(rest []byte, col int) bool {
	if !lineEnd(rest) {
		return s.fail()
	}
	s.advance()
	if s.col > col {
		return s.fail()
	}
	return true
}

// rules decodes the value of the top-level "rules" key; rest is what
// follows "rules:" on its line.
func (s *scanner) rules(rest []byte) ([]Rule, bool) {
	rest = skipSpaces(rest)
	if len(rest) > 0 && rest[0] != '#' {
		// A one-line flow sequence of flow mappings.
		if rest[0] != '[' {
			return nil, s.fail()
		}
		out := []Rule{}
		rest, ok := flowList(rest, func(b []byte) ([]byte, bool) {
			out = append(out, Rule{})
			return s.flowRule(b, &out[len(out)-1])
		})
		return out, ok && s.afterInline(rest, 0)
	}
	s.advance()
	var out []Rule
	if !s.eof && isDash(s.text) {
		// As many rules as lines start an item at this column, about: a
		// large document's rules are not copied over and over as they grow.
		item := append(append([]byte{'\n'}, bytes.Repeat([]byte{' '}, s.col)...), '-', ' ')
		out = make([]Rule, 0, 1+bytes.Count(s.data[s.next:], item))
	}
	ok := s.blockSeq(0, func(seq, col int, item []byte) bool {
		out = append(out, Rule{})
		r := &out[len(out)-1]
		if item[0] == '{' {
			rest, ok := s.flowRule(item, r)
			return ok && s.afterInline(rest, seq)
		}
		var seen int
		ok := s.blockMap(col, item, func(key string, rest []byte, col int) bool {
			return s.ruleField(r, &seen, key, rest, col)
		})
		if seen&fCost == 0 {
			r.Cost = 1
		}
		return ok
	})
	return out, ok
}

// blockSeq decodes a block sequence that is the value of a key at column
// parent (the sequence may start at that column or deeper; anything else,
// "key:" with nothing under it included, is refused), calling item with the
// sequence's column, the column of the item's content and the content.
// item must leave the scanner on the first line after the item.
func (s *scanner) blockSeq(parent int, item func(seq, col int, content []byte) bool) bool {
	if s.eof || s.col < parent || !isDash(s.text) {
		return s.fail()
	}
	col := s.col
	for !s.bad {
		content := s.text[1:]
		n := len(content)
		content = skipSpaces(content)
		if n == 0 || n == len(content) || len(content) == 0 || content[0] == '#' {
			return s.fail() // "-" alone: the item is on the next lines, or null
		}
		if !item(col, col+1+n-len(content), content) {
			return s.fail()
		}
		switch {
		case s.col == col && isDash(s.text):
			continue
		case s.col < col, s.col == col && col == parent:
			return true // the parent's next key, or the end of its block
		default:
			return s.fail()
		}
	}
	return false
}

// blockMap decodes a block mapping whose first key starts the content first
// at column col: field decodes one key's value (rest follows "key:") and
// leaves the scanner on the first line after it.
func (s *scanner) blockMap(col int, first []byte, field func(key string, rest []byte, col int) bool) bool {
	text := first
	for {
		key, rest, ok := mappingKey(text)
		if !ok || !field(key, rest, col) {
			return s.fail()
		}
		switch {
		case s.bad:
			return false
		case s.col == col:
			text = s.text
		case s.col < col:
			return true
		default:
			return s.fail()
		}
	}
}

// ruleBit is the bit of a rule key the scanner knows, or 0.
func ruleBit(key string) int {
	switch key {
	case "id":
		return fID
	case "match":
		return fMatch
	case "key":
		return fKey
	case "algorithm":
		return fAlgorithm
	case "limit":
		return fLimit
	case "window":
		return fWindow
	case "burst":
		return fBurst
	case "cost":
		return fCost
	case "min_interval":
		return fMinInterval
	case "shadow":
		return fShadow
	case "scope":
		return fScope
	case "disabled":
		return fDisabled
	case "behaviour":
		return fBehaviour
	case "metrics":
		return fMetrics
	}
	return 0
}

// ruleField decodes one field of a block-mapping rule whose keys are at
// column col; rest follows "key:".
func (s *scanner) ruleField(r *Rule, seen *int, key string, rest []byte, col int) bool {
	bit := ruleBit(key)
	if bit == 0 || *seen&bit != 0 {
		return s.fail()
	}
	*seen |= bit
	rest = skipSpaces(rest)
	if len(rest) == 0 || rest[0] == '#' {
		// The value is on the lines below: a list or the match mapping.
		s.advance()
		switch bit {
		case fMatch:
			if s.col <= col || isDash(s.text) {
				return s.fail()
			}
			var seenM int
			return s.blockMap(s.col, s.text, func(key string, rest []byte, col int) bool {
				return s.matchField(&r.Match, &seenM, key, rest, col)
			})
		case fKey:
			r.Key = s.blockStrings(col, true)
			return r.Key != nil
		}
		return s.fail()
	}
	var ok bool
	if bit == fMatch && rest[0] == '{' {
		rest, ok = s.flowMatch(rest, &r.Match)
	} else {
		rest, ok = s.ruleValue(r, bit, rest, false)
	}
	return ok && s.afterInline(rest, col)
}

// matchField is ruleField for the fields of match.
func (s *scanner) matchField(m *MatchSpec, seen *int, key string, rest []byte, col int) bool {
	list, bit, intern := matchList(m, key)
	if list == nil || *seen&bit != 0 {
		return s.fail()
	}
	*seen |= bit
	rest = skipSpaces(rest)
	if len(rest) == 0 || rest[0] == '#' {
		s.advance()
		*list = s.blockStrings(col, intern)
		return *list != nil
	}
	rest, ok := s.flowStrings(rest, list, intern)
	return ok && s.afterInline(rest, col)
}

// matchList is the list a match key names, its bit and whether its values
// are interned (path prefixes and methods repeat, hosts do not).
func matchList(m *MatchSpec, key string) (*[]string, int, bool) {
	switch key {
	case "hosts":
		return &m.Hosts, 1, false
	case "path_prefix":
		return &m.PathPrefix, 2, true
	case "methods":
		return &m.Methods, 4, true
	}
	return nil, 0, false
}

// blockStrings decodes a block sequence of scalars under a key at column
// parent; nil when it is not one.
func (s *scanner) blockStrings(parent int, intern bool) []string {
	out := []string{}
	ok := s.blockSeq(parent, func(seq, _ int, item []byte) bool {
		v, rest, ok := s.str(item, false, intern)
		out = append(out, v)
		return ok && s.afterInline(rest, seq)
	})
	if !ok {
		return nil
	}
	return out
}

// ruleValue decodes the inline value b of the rule field bit (all but
// match), in flow context or not, and returns what follows it.
func (s *scanner) ruleValue(r *Rule, bit int, b []byte, flow bool) ([]byte, bool) {
	var ok bool
	var v string
	switch bit {
	case fID:
		r.ID, b, ok = s.str(b, flow, false)
	case fKey:
		return s.flowStrings(b, &r.Key, true)
	case fAlgorithm:
		v, b, ok = s.str(b, flow, true)
		r.Algorithm = Algorithm(v)
	case fScope:
		v, b, ok = s.str(b, flow, true)
		r.Scope = Scope(v)
	case fLimit:
		r.Limit, b, ok = plainIntIn(b, flow)
	case fBurst:
		r.Burst, b, ok = plainIntIn(b, flow)
	case fCost:
		r.Cost, b, ok = plainIntIn(b, flow)
	case fWindow:
		r.Window, b, ok = s.duration(b, flow)
	case fMinInterval:
		r.MinInterval, b, ok = s.duration(b, flow)
	case fShadow:
		r.Shadow, b, ok = plainBool(b, flow)
	case fDisabled:
		r.Disabled, b, ok = plainBool(b, flow)
	case fBehaviour:
		r.Behaviour, b, ok = plainBool(b, flow)
	case fMetrics:
		r.Metrics, b, ok = plainBool(b, flow)
	}
	return b, ok
}

// flowRule decodes a one-line flow mapping rule starting at b[0] == '{'.
func (s *scanner) flowRule(b []byte, r *Rule) ([]byte, bool) {
	if len(b) == 0 || b[0] != '{' {
		return nil, s.fail()
	}
	var seen int
	rest, ok := flowMap(b, func(key string, b []byte) ([]byte, bool) {
		bit := ruleBit(key)
		if bit == 0 || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
		if bit == fMatch {
			return s.flowMatch(b, &r.Match)
		}
		return s.ruleValue(r, bit, b, true)
	})
	if seen&fCost == 0 {
		r.Cost = 1
	}
	if !ok {
		return nil, s.fail()
	}
	return rest, true
}

// flowMatch decodes a one-line flow mapping of match lists.
func (s *scanner) flowMatch(b []byte, m *MatchSpec) ([]byte, bool) {
	if len(b) == 0 || b[0] != '{' {
		return nil, false
	}
	var seen int
	return flowMap(b, func(key string, b []byte) ([]byte, bool) {
		list, bit, intern := matchList(m, key)
		if list == nil || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
		return s.flowStrings(b, list, intern)
	})
}

// flowStrings decodes a one-line flow sequence of scalars into *out (an
// empty list is an empty, non-nil slice, as yaml.v3 decodes it).
func (s *scanner) flowStrings(b []byte, out *[]string, intern bool) ([]byte, bool) {
	if len(b) == 0 || b[0] != '[' {
		return nil, false
	}
	list := make([]string, 0, 2)
	rest, ok := flowList(b, func(b []byte) ([]byte, bool) {
		v, rest, ok := s.str(b, true, intern)
		list = append(list, v)
		return rest, ok
	})
	*out = list
	return rest, ok
}

// flowList walks a one-line flow sequence starting at b[0] == '[', calling
// item at each item; it returns what follows the closing bracket.
func flowList(b []byte, item func(b []byte) ([]byte, bool)) ([]byte, bool) {
	return flowItems(b, ']', item)
}

// flowMap walks a one-line flow mapping starting at b[0] == '{', calling
// field with each key and what follows "key: ".
func flowMap(b []byte, field func(key string, b []byte) ([]byte, bool)) ([]byte, bool) {
	return flowItems(b, '}', func(b []byte) ([]byte, bool) {
		key, rest, ok := mappingKey(b)
		if !ok || len(rest) == 0 || rest[0] != ' ' {
			return nil, false // "{a:b}" and "{a:}" read differently in flow context
		}
		return field(key, skipSpaces(rest))
	})
}

func flowItems(b []byte, closing byte, item func(b []byte) ([]byte, bool)) ([]byte, bool) {
	b = skipSpaces(b[1:])
	if len(b) > 0 && b[0] == closing {
		return b[1:], true
	}
	for {
		rest, ok := item(b)
		if !ok {
			return nil, false
		}
		b = skipSpaces(rest)
		switch {
		case len(b) == 0:
			return nil, false // continued on the next line
		case b[0] == closing:
			return b[1:], true
		case b[0] != ',':
			return nil, false
		}
		b = skipSpaces(b[1:])
		if len(b) == 0 || b[0] == closing || b[0] == ',' {
			return nil, false // a trailing comma or an empty entry
		}
	}
}

// str decodes a scalar that yaml.v3 would decode into a string field as
// the same string: quoted, or plain and resolving to !!str.
func (s *scanner) str(b []byte, flow, intern bool) (string, []byte, bool) {
	if len(b) == 0 {
		return "", nil, false
	}
	var v, rest []byte
	var ok bool
	if b[0] == '"' || b[0] == '\'' {
		v, rest, ok = quoted(b, flow)
	} else {
		v, rest, ok = plain(b, flow)
		ok = ok && plainIsString(v)
	}
	if !ok {
		return "", nil, false
	}
	if !intern {
		return string(v), rest, true
	}
	if str, ok := s.interned[string(v)]; ok {
		return str, rest, true
	}
	str := string(v)
	if s.interned == nil {
		s.interned = map[string]string{}
	}
	if len(s.interned) < 1024 {
		s.interned[str] = str
	}
	return str, rest, true
}

// duration is a string that time.ParseDuration takes (Duration.UnmarshalYAML).
func (s *scanner) duration(b []byte, flow bool) (Duration, []byte, bool) {
	v, rest, ok := s.str(b, flow, true)
	if !ok {
		return 0, nil, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, nil, false
	}
	return Duration(d), rest, true
}

// plainIntIn is plainInt in flow or block context.
func plainIntIn(b []byte, flow bool) (int64, []byte, bool) {
	v, rest, ok := plain(b, flow)
	if !ok {
		return 0, nil, false
	}
	n, tail, ok := plainInt(v)
	return n, rest, ok && len(tail) == 0
}

// plainInt reads a plain decimal integer ("100", "-3", "0"; no leading
// zeros, sign "+", underscores or other bases, which yaml.v3 reads by its
// own rules) at the start of b and returns what follows it.
func plainInt(b []byte) (int64, []byte, bool) {
	i := 0
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		i++
	}
	start := i
	var v int64
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		v = v*10 + int64(b[i]-'0')
		i++
	}
	n := i - start
	if n == 0 || n > 18 || b[start] == '0' && n > 1 { // 18 digits cannot overflow
		return 0, nil, false
	}
	if i < len(b) && b[i] != ' ' {
		return 0, nil, false
	}
	if neg {
		v = -v
	}
	return v, b[i:], true
}

// plainBool reads true or false.
func plainBool(b []byte, flow bool) (bool, []byte, bool) {
	v, rest, ok := plain(b, flow)
	switch {
	case !ok:
		return false, nil, false
	case string(v) == "true":
		return true, rest, true
	case string(v) == "false":
		return false, rest, true
	}
	return false, nil, false
}

// plain scans a plain scalar at the start of b, in flow context (inside
// [] or {}) or not, and returns it and what follows it. It refuses
// whatever could start or end one differently in yaml.v3: indicators at the
// start (anchors, aliases, tags, block scalars, quotes, "- ", "? ", ": "),
// ": " or a final ":" (a key), flow indicators inside it, anything but
// printable ASCII.
func plain(b []byte, flow bool) ([]byte, []byte, bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	if c := b[0]; c == '-' {
		if len(b) < 2 || b[1] < '0' || b[1] > '9' {
			return nil, nil, false
		}
	} else if strings.IndexByte("?:,[]{}#&*!|>'\"%@`", c) >= 0 {
		return nil, nil, false
	}
	end := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == ' ':
			if i+1 < len(b) && b[i+1] == '#' {
				return b[:end], b[end:], true // a comment
			}
			continue
		case c < 0x20 || c > 0x7e:
			return nil, nil, false
		case c == ':':
			if flow || i+1 == len(b) || b[i+1] == ' ' {
				return nil, nil, false
			}
		case c == ',' || c == ']' || c == '}':
			if flow {
				return b[:end], b[end:], true
			}
			return nil, nil, false
		case c == '[' || c == '{':
			return nil, nil, false
		}
		end = i + 1
	}
	return b[:end], b[end:], true
}

// quoted scans a one-line quoted scalar without escapes at the start of b.
func quoted(b []byte, flow bool) ([]byte, []byte, bool) {
	q := b[0]
	j := bytes.IndexByte(b[1:], q)
	if j < 0 {
		return nil, nil, false // continued on the next line
	}
	v, rest := b[1:1+j], b[2+j:]
	if q == '\'' && len(rest) > 0 && rest[0] == '\'' {
		return nil, nil, false // '' is an escaped quote
	}
	for _, c := range v {
		if c < 0x20 || c > 0x7e || c == '\\' && q == '"' {
			return nil, nil, false
		}
	}
	// What may follow: the end of the line, a comment, or in flow context
	// the next item or the end of the collection; not ":" (a quoted key).
	t := skipSpaces(rest)
	switch {
	case len(t) == 0, t[0] == '#' && len(t) < len(rest):
	case flow && (t[0] == ',' || t[0] == ']' || t[0] == '}'):
	default:
		return nil, nil, false
	}
	return v, rest, true
}

// plainIsString reports whether yaml.v3 resolves the plain scalar v to
// !!str for certain (resolve in yaml.v3's resolve.go): not null, not a
// bool, not a merge key, and not anything that might read as an int, a
// float or a timestamp. Of the values that start with a digit, it takes
// those made of digits, dots and the duration units' letters h, m, s, n,
// u with at least one such letter ("1m", "250ms", "1h30m"): no int base,
// float or timestamp has those letters and no '-'. Other values starting
// with a digit, a sign or a dot are left to yaml.v3.
func plainIsString[S ~string | ~[]byte](v S) bool {
	if len(v) == 0 {
		return false
	}
	switch c := v[0]; {
	case c == '+' || c == '-' || c == '.':
		return false
	case '0' <= c && c <= '9':
		letter := false
		for i := 0; i < len(v); i++ {
			switch v[i] {
			case 'h', 'm', 's', 'n', 'u':
				letter = true
			case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.':
			default:
				return false
			}
		}
		return letter
	case strings.IndexByte("yYnNtTfFoO~<", c) >= 0:
		switch string(v) {
		case "true", "True", "TRUE", "false", "False", "FALSE", "~", "null", "Null", "NULL", "<<":
			return false
		}
	}
	return true
}

// mappingKey reads "key:" at the start of b, for the keys the scanner
// knows (lower-case letters and underscores), and returns the key and what
// follows the colon, which must be the end of the line or a space.
func mappingKey(b []byte) (string, []byte, bool) {
	i := 0
	for i < len(b) && ('a' <= b[i] && b[i] <= 'z' || b[i] == '_') {
		i++
	}
	if i == 0 || i == len(b) || b[i] != ':' || i+1 < len(b) && b[i+1] != ' ' {
		return "", nil, false
	}
	return knownKey(b[:i]), b[i+1:], true
}

// knownKey returns the key as a string without allocating for the keys a
// document has on every rule.
func knownKey(b []byte) string {
	switch string(b) {
	case "id":
		return "id"
	case "match":
		return "match"
	case "hosts":
		return "hosts"
	case "path_prefix":
		return "path_prefix"
	case "methods":
		return "methods"
	case "key":
		return "key"
	case "algorithm":
		return "algorithm"
	case "limit":
		return "limit"
	case "window":
		return "window"
	case "burst":
		return "burst"
	case "cost":
		return "cost"
	case "min_interval":
		return "min_interval"
	case "shadow":
		return "shadow"
	case "scope":
		return "scope"
	case "disabled":
		return "disabled"
	case "behaviour":
		return "behaviour"
	case "metrics":
		return "metrics"
	case "version":
		return "version"
	case "rules":
		return "rules"
	}
	return string(b)
}

// isDash reports whether a line's content starts a block sequence item.
func isDash(text []byte) bool {
	return len(text) > 0 && text[0] == '-' && (len(text) == 1 || text[1] == ' ')
}

// isMarker reports whether text is the marker m alone (a comment may follow).
func isMarker(text []byte, m string) bool {
	rest, ok := bytes.CutPrefix(text, []byte(m))
	return ok && (len(rest) == 0 || rest[0] == ' ' && lineEnd(rest))
}

// lineEnd reports whether b (what follows a value) holds nothing but
// blanks and a comment.
func lineEnd(b []byte) bool {
	t := skipSpaces(b)
	switch {
	case len(t) == 0:
		return true
	case t[0] == '#' && len(t) < len(b):
		return commentOK(t)
	}
	return false
}

// commentOK reports whether a comment holds only what yaml.v3 reads as
// part of one: printable characters and tabs, no line break of any kind
// (a lone CR, NEL, U+2028, U+2029 end a line in YAML) and no BOM.
func commentOK(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && n == 1, r < 0xa0, r == 0x2028, r == 0x2029, r == 0xfeff,
			r > 0xd7ff && r < 0xe000, r == 0xfffe, r == 0xffff:
			return false
		}
		i += n
	}
	return true
}

func skipSpaces(b []byte) []byte {
	for len(b) > 0 && b[0] == ' ' {
		b = b[1:]
	}
	return b
}
