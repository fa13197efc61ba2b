package hosts

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

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
// number for a duration, anchors and aliases and a second document are all
// errors), validates it and returns it with its host patterns normalised.
// The error holds every problem, each with its line.
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
	if n := findAlias(&root); n != nil {
		return nil, &Problem{Line: n.Line, Msg: "YAML anchors and aliases are not allowed"}
	}
	var t Table
	strict := yaml.NewDecoder(bytes.NewReader(doc))
	strict.KnownFields(true)
	var errs []error
	err := strict.Decode(&t)
	whole := err == nil
	if err != nil {
		// Fields of the wrong type leave the rest decoded, which is
		// validated too; a repeated key leaves its whole mapping out,
		// and any other error leaves nothing worth validating.
		var te *yaml.TypeError
		whole = errors.As(err, &te)
		for _, p := range Problems(yamlProblems(err)) {
			if p.Path == "" && p.Line > 0 {
				p.Path = pathAt(&root, p.Line)
			}
			whole = whole && !strings.Contains(p.Msg, "already defined at line")
			errs = append(errs, p)
		}
	}
	if whole {
		errs = append(errs, t.validate(lines{&root})...)
	}
	if len(errs) > 0 {
		sortProblems(errs)
		return nil, errors.Join(errs...)
	}
	t.Hosts = t.normalizedHosts()
	return &t, nil
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

// findAlias returns the first alias or anchor in the tree, or nil. A host
// table has no use for them, and refusing them bounds what a small
// document can expand to.
func findAlias(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return n
	}
	for _, c := range n.Content {
		if a := findAlias(c); a != nil {
			return a
		}
	}
	return nil
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
type lines struct{ root *yaml.Node }

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
			for j := 0; j+1 < len(n.Content); j += 2 {
				if n.Content[j].Value == step {
					keyNode, next = n.Content[j], n.Content[j+1]
					break
				}
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

// pathAt is the path of the deepest mapping key on line, for the problems
// yaml.v3 reports with a line alone ("" when none).
func pathAt(root *yaml.Node, line int) string {
	best := ""
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for j := 0; j+1 < len(n.Content); j += 2 {
				k, v := n.Content[j], n.Content[j+1]
				p := quote(k.Value)
				if path != "" {
					p = path + "." + p
				}
				if k.Line == line {
					best = p
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := path + "[" + strconv.Itoa(i) + "]"
				// An item on its sequence's own line (a flow sequence
				// after its key) is named by the key.
				if c.Line == line && c.Kind == yaml.ScalarNode && n.Line != line {
					best = p
				}
				walk(c, p)
			}
		}
	}
	walk(root, "")
	return best
}
