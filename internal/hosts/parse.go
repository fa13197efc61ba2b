package hosts

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// ErrInvalid is wrapped by every problem of a host table, for errors.Is.
var ErrInvalid = errors.New("invalid host table")

// Problem is one thing wrong with a host table: Parse, ParseFile and
// Validate join every one of them with errors.Join; Problems picks them
// apart.
type Problem struct {
	File string // set by ParseFile
	Line int    // 1-based; 0 when unknown (a table built in Go)
	Path string // e.g. `pools.shop.urls[0]`, `hosts."*.example.com".pool`; "" for the document
	Msg  string
}

func (p *Problem) Error() string {
	var b strings.Builder
	switch {
	case p.File != "" && p.Line > 0:
		b.WriteString(p.File + ":" + strconv.Itoa(p.Line) + ": ")
	case p.File != "":
		b.WriteString(p.File + ": ")
	case p.Line > 0:
		b.WriteString("line " + strconv.Itoa(p.Line) + ": ")
	}
	if p.Path != "" {
		b.WriteString(p.Path + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Unwrap makes every problem an ErrInvalid.
func (p *Problem) Unwrap() error { return ErrInvalid }

// Problems lists the problems err holds, in order.
func Problems(err error) []*Problem {
	var out []*Problem
	var walk func(error)
	walk = func(e error) {
		if p, ok := e.(*Problem); ok {
			out = append(out, p)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// Parse reads a host table strictly (unknown and repeated fields, a bare
// number for a duration, anchors, aliases and merge keys, a mapping other
// than hosts over 512 keys and a second document are all errors),
// validates it and returns it with its host patterns normalised. The error
// holds every problem, each with its line. Its time is linear in the
// document's size.
func Parse(doc []byte) (*Table, error) {
	if len(doc) > MaxDocumentSize {
		return nil, &Problem{Msg: fmt.Sprintf("document of %d bytes is over the %d byte limit", len(doc), MaxDocumentSize)}
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Problem{Path: "version", Msg: fmt.Sprintf("empty document: a table needs at least \"version: %d\" (which sends every host to the %q pool)", SchemaVersion, DefaultPool)}
		}
		return nil, yamlProblems(err)
	}
	var second yaml.Node
	if err := dec.Decode(&second); !errors.Is(err, io.EOF) {
		line := second.Line
		if err != nil {
			line = 0
		}
		return nil, &Problem{Line: line, Msg: "only one YAML document is allowed"}
	}
	if p := unsupported(&root); p != nil {
		return nil, p
	}
	var t Table
	var errs []error
	at := newLines(&root)
	paths := &linePaths{root: &root}
	// Fields of the wrong type leave the rest decoded, which is validated
	// too; a repeated key leaves its whole mapping out, and any other error
	// leaves nothing worth validating.
	whole := true
	problems := func(err error, typeErrors bool) {
		if err == nil {
			return
		}
		var te *yaml.TypeError
		whole = whole && (typeErrors || errors.As(err, &te))
		for _, p := range Problems(yamlProblems(err)) {
			if p.Path == "" && p.Line > 0 {
				p.Path = paths.at(p.Line)
			}
			whole = whole && !strings.Contains(p.Msg, "already defined at line")
			errs = append(errs, p)
		}
	}
	if root.Content[0].Kind != yaml.MappingNode {
		// Not a table at all: yaml.v3 says so in Table's terms.
		problems(root.Decode(&t), false)
	} else {
		var d document
		problems(decodeStrict(&root, &d), false)
		t.Schema, t.Pools, t.Defaults = d.Schema, d.Pools, d.Defaults
		if n := len(d.Hosts.Content) / 2; d.Hosts.Kind == yaml.MappingNode && n > MaxHosts {
			// Validate's problem, before decoding entries refused anyway.
			errs = append(errs, &Problem{Line: at.of(true, "hosts"), Path: "hosts", Msg: fmt.Sprintf("%d hosts, at most %d", n, MaxHosts)})
			whole = false
		} else {
			var err error
			t.Hosts, err = decodeHosts(&d.Hosts)
			problems(err, true)
		}
	}
	if whole {
		errs = append(errs, t.validate(at)...)
	}
	if len(errs) > 0 {
		sortProblems(errs)
		return nil, errors.Join(errs...)
	}
	t.Hosts = t.normalizedHosts()
	return &t, nil
}

// document is Table as Parse decodes it strictly, with the hosts mapping
// left as a node for decodeHosts: yaml.v3 looks for a repeated key by
// comparing every key of a mapping with every later one, which takes
// minutes at 100,000 hosts.
type document struct {
	Schema   int             `yaml:"version"`
	Pools    map[string]Pool `yaml:"pools"`
	Hosts    yaml.Node       `yaml:"hosts"`
	Defaults *Defaults       `yaml:"defaults"`
}

// decodeStrict decodes the tree into out as yaml.v3's strict decoder
// would, without parsing the document again: a mapping key that is not a
// field of the struct it decodes into is an error, with yaml.v3's message.
func decodeStrict(root *yaml.Node, out any) error {
	err := root.Decode(out)
	unknown := unknownFields(root, reflect.TypeOf(out).Elem(), nil)
	if len(unknown) == 0 {
		return err
	}
	return &yaml.TypeError{Errors: append(typeErrors(err), unknown...)}
}

var (
	nodeType        = reflect.TypeFor[yaml.Node]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// unknownFields appends to msgs a message for every mapping key under n
// that names no field of the struct it decodes into (t: n's Go type).
func unknownFields(n *yaml.Node, t reflect.Type, msgs []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return msgs
	}
	switch {
	case n.Kind == yaml.DocumentNode:
		for _, c := range n.Content {
			msgs = unknownFields(c, t, msgs)
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := structFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				continue // not a field name: a type error of its own
			}
			if ft, ok := fields[k.Value]; ok {
				msgs = unknownFields(n.Content[i+1], ft, msgs)
			} else {
				msgs = append(msgs, fmt.Sprintf("line %d: field %s not found in type %s", k.Line, k.Value, t))
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 1; i < len(n.Content); i += 2 {
			msgs = unknownFields(n.Content[i], t.Elem(), msgs)
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for _, c := range n.Content {
			msgs = unknownFields(c, t.Elem(), msgs)
		}
	}
	return msgs
}

// decodeHosts decodes the hosts mapping n as a strict decoder would into a
// map[string]Host, with the same messages, in time linear in its size: a
// repeated key (the same kind and spelling, as yaml.v3 compares them)
// leaves the whole mapping out, an entry is decoded on its own, and a field
// Host does not have is an error. The error is a *yaml.TypeError.
func decodeHosts(n *yaml.Node) (map[string]Host, error) {
	if n.Kind == 0 { // no hosts key
		return nil, nil
	}
	var out map[string]Host
	if n.Kind != yaml.MappingNode {
		err := n.Decode(&out) // null, or yaml.v3's own type error
		return out, err
	}
	var msgs []string
	type key struct {
		kind  yaml.Kind
		value string
	}
	first := make(map[key]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if line, dup := first[key{k.Kind, k.Value}]; dup {
			msgs = append(msgs, fmt.Sprintf("line %d: mapping key %#v already defined at line %d", k.Line, k.Value, line))
		} else {
			first[key{k.Kind, k.Value}] = k.Line
		}
	}
	if len(msgs) > 0 {
		return nil, &yaml.TypeError{Errors: msgs}
	}
	out = make(map[string]Host, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			if err := k.Decode(&name); err != nil {
				msgs = append(msgs, typeErrors(err)...)
				continue
			}
		}
		var h Host
		err := v.Decode(&h)
		msgs = append(msgs, typeErrors(err)...)
		msgs = unknownFields(v, hostType, msgs)
		if err == nil || v.Kind == yaml.MappingNode {
			out[name] = h
		}
	}
	if len(msgs) > 0 {
		return out, &yaml.TypeError{Errors: msgs}
	}
	return out, nil
}

// typeErrors are the messages of a yaml.v3 error.
func typeErrors(err error) []string {
	var te *yaml.TypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return te.Errors
	default:
		return []string{err.Error()}
	}
}

var hostType = reflect.TypeFor[Host]()

// fieldsOf caches structFields by type: reflect.Type -> map[string]reflect.Type.
var fieldsOf sync.Map

// structFields maps the YAML field names of struct type t, those of its
// inline fields included, to their types.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldsOf.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	defer fieldsOf.Store(t, out)
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline":
			maps.Copy(out, structFields(f.Type))
		case name == "-" || !f.IsExported():
		case name == "":
			out[strings.ToLower(f.Name)] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}

// ParseFile is Parse of a file, each problem naming it (FILE:LINE: ...).
func ParseFile(path string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading host table: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading host table: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		probs := Problems(err)
		errs := make([]error, len(probs))
		for i, p := range probs {
			p.File = path
			errs[i] = p
		}
		if len(data) > MaxDocumentSize {
			probs[0].Msg = fmt.Sprintf("file is over the %d byte limit", MaxDocumentSize)
		}
		return nil, errors.Join(errs...)
	}
	return t, nil
}

// maxMappingKeys bounds every mapping but the hosts mapping: yaml.v3
// compares each key of a mapping with every later one, so a hostile
// document of one huge mapping would cost minutes. The largest a valid
// table has is pools, at most MaxPools; above twice that, a mapping is
// refused before yaml.v3 decodes it.
const maxMappingKeys = 2 * MaxPools

// unsupported returns the first thing in the tree Parse refuses before
// decoding, or nil: an anchor or alias (a host table has no use for them,
// and refusing them bounds what a small document can expand to), a merge
// key (which only makes sense with aliases), or a mapping other than the
// hosts mapping over maxMappingKeys keys.
func unsupported(root *yaml.Node) *Problem {
	var hostsMap *yaml.Node
	if doc := root.Content[0]; doc.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(doc.Content); i += 2 {
			if doc.Content[i].Value == "hosts" && doc.Content[i+1].Kind == yaml.MappingNode {
				hostsMap = doc.Content[i+1]
			}
		}
	}
	var steps []string // the keys down to the node walked; "\x00" marks the others
	path := func() string {
		p := ""
		for _, s := range steps {
			switch {
			case s == "\x00": // a document's content
			case strings.HasPrefix(s, "\x00["): // a sequence item
				p += s[1:]
			default:
				p = dotted(p, quote(s))
			}
		}
		return p
	}
	var walk func(n *yaml.Node) *Problem
	walk = func(n *yaml.Node) *Problem {
		if n.Kind == yaml.AliasNode || n.Anchor != "" {
			return &Problem{Line: n.Line, Msg: "YAML anchors and aliases are not allowed"}
		}
		if n.Kind == yaml.MappingNode && n != hostsMap && len(n.Content)/2 > maxMappingKeys {
			return &Problem{Line: n.Line, Path: path(), Msg: fmt.Sprintf("a mapping of %d keys, at most %d", len(n.Content)/2, maxMappingKeys)}
		}
		for i, c := range n.Content {
			switch n.Kind {
			case yaml.MappingNode:
				if i%2 == 0 && c.ShortTag() == "!!merge" {
					return &Problem{Line: c.Line, Msg: "YAML merge keys (<<) are not allowed"}
				}
				steps = append(steps, n.Content[i&^1].Value)
			case yaml.SequenceNode:
				steps = append(steps, "\x00["+strconv.Itoa(i)+"]")
			default:
				steps = append(steps, "\x00")
			}
			bad := walk(c)
			steps = steps[:len(steps)-1]
			if bad != nil {
				return bad
			}
		}
		return nil
	}
	return walk(root)
}

func dotted(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
var unknownField = regexp.MustCompile(`^field (\S+) not found in type \S+$`)

// yamlProblems turns a yaml.v3 error into problems with their lines.
func yamlProblems(err error) error {
	var te *yaml.TypeError
	var msgs []string
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	var errs []error
	for _, m := range msgs {
		p := &Problem{Msg: strings.TrimPrefix(m, "yaml: ")}
		if sm := yamlLine.FindStringSubmatch(m); sm != nil {
			p.Line, _ = strconv.Atoi(sm[1])
			p.Msg = sm[2]
		}
		if sm := unknownField.FindStringSubmatch(p.Msg); sm != nil {
			p.Msg = fmt.Sprintf("unknown field %q", sm[1])
		}
		errs = append(errs, p)
	}
	return errors.Join(errs...)
}

func sortProblems(errs []error) {
	sort.SliceStable(errs, func(i, j int) bool {
		a, aok := errs[i].(*Problem)
		b, bok := errs[j].(*Problem)
		return aok && bok && a.Line < b.Line
	})
}

// lines finds the line of a field in the document tree (nil tree: 0).
// Large mappings (the hosts) are indexed the first time they are searched,
// so a table with a problem on every host costs no more than linear time.
type lines struct {
	root *yaml.Node
	keys map[*yaml.Node]map[string]int // mapping -> key -> its first index in Content
}

func newLines(root *yaml.Node) lines {
	return lines{root: root, keys: map[*yaml.Node]map[string]int{}}
}

// key returns the index in mapping n's Content of its first key named
// step, or -1.
func (l lines) key(n *yaml.Node, step string) int {
	if l.keys == nil || len(n.Content) < 64 {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == step {
				return j
			}
		}
		return -1
	}
	ix := l.keys[n]
	if ix == nil {
		ix = make(map[string]int, len(n.Content)/2)
		for j := 0; j+1 < len(n.Content); j += 2 {
			if _, dup := ix[n.Content[j].Value]; !dup {
				ix[n.Content[j].Value] = j
			}
		}
		l.keys[n] = ix
	}
	if j, ok := ix[step]; ok {
		return j
	}
	return -1
}

// of returns the line of the node at path: mapping keys, or "[i]" for a
// sequence item. With key set it is the line of the last mapping key
// itself, else of its value. The deepest node found counts when the path
// goes further than the tree.
func (l lines) of(key bool, path ...string) int {
	if l.root == nil {
		return 0
	}
	n := l.root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for i, step := range path {
		var next, keyNode *yaml.Node
		switch {
		case n.Kind == yaml.MappingNode:
			if j := l.key(n, step); j >= 0 {
				keyNode, next = n.Content[j], n.Content[j+1]
			}
		case n.Kind == yaml.SequenceNode && strings.HasPrefix(step, "["):
			if k, err := strconv.Atoi(strings.Trim(step, "[]")); err == nil && k >= 0 && k < len(n.Content) {
				next = n.Content[k]
			}
		}
		if next == nil {
			return line
		}
		if key && keyNode != nil && i == len(path)-1 {
			return keyNode.Line
		}
		n, line = next, next.Line
	}
	return line
}

// linePaths names the path of the deepest mapping key on a line, for the
// problems yaml.v3 reports with a line alone ("" when none). The tree is
// walked once, when the first problem asks.
type linePaths struct {
	root  *yaml.Node
	paths map[int]string
}

func (l *linePaths) at(line int) string {
	if l.paths == nil {
		l.paths = map[int]string{}
		l.walk(l.root, "")
	}
	return l.paths[line]
}

func (l *linePaths) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			l.walk(c, path)
		}
	case yaml.MappingNode:
		for j := 0; j+1 < len(n.Content); j += 2 {
			k, v := n.Content[j], n.Content[j+1]
			p := dotted(path, quote(k.Value))
			l.paths[k.Line] = p
			l.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			// An item on its sequence's own line (a flow sequence
			// after its key) is named by the key.
			if c.Kind == yaml.ScalarNode && n.Line != c.Line {
				l.paths[c.Line] = p
			}
			l.walk(c, p)
		}
	}
}
