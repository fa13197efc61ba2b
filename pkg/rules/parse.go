package rules

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse errors that callers may want to tell apart.
var (
	ErrEmpty              = errors.New("empty document")
	ErrMultipleDocuments  = errors.New("multiple YAML documents; want exactly one")
	ErrUnsupportedVersion = errors.New("unsupported document version")
)

// Parse reads one rules document: yaml.v3 parses the text into a node tree,
// the tree is decoded strictly into a Document (decode.go), and the
// Document is validated. Every problem is reported at once, each a
// *FieldError with its line: YAML syntax, unknown or repeated fields (with
// the nearest valid name), values of the wrong kind, and every validation
// problem. The returned document is normalized (see Validate).
func Parse(data []byte) (*Document, error) {
	doc, decodeErrs, err := decodeText(data)
	if err != nil {
		return nil, err
	}
	var errs []*FieldError
	more := 0 // problems left out (MaxProblems)
	for _, fe := range decodeErrs {
		if fe.more > 0 {
			more += fe.more
		} else {
			errs = append(errs, fe)
		}
	}
	decodeErrs = errs
	var root *yaml.Node // to find the lines of validation problems
	verrs := fieldErrors(doc.validate(true))
	if slices.ContainsFunc(verrs, isTooLarge) {
		return nil, fmt.Errorf("rules: invalid document:\n%w", errors.Join(asErrors(verrs)...)) // no line to look for
	}
	for _, fe := range verrs {
		if fe.more > 0 {
			more += fe.more
			continue
		}
		if coveredBy(fe, decodeErrs) {
			continue
		}
		if root == nil {
			if root, err = parseTree(data); err != nil {
				return nil, err // cannot be: it parsed before
			}
		}
		fe.Line = locate(root, fe)
		errs = append(errs, fe)
	}
	if len(errs) == 0 && more == 0 {
		return doc, nil
	}
	slices.SortStableFunc(errs, func(a, b *FieldError) int { return cmp.Compare(a.Line, b.Line) })
	if n := len(errs) - MaxProblems; n > 0 {
		errs, more = errs[:MaxProblems:MaxProblems], more+n
	}
	if more > 0 {
		// The rest would cost more to say than the document to read.
		errs = append(errs, moreProblems(more))
	}
	return nil, fmt.Errorf("rules: invalid document:\n%w", errors.Join(asErrors(errs)...))
}

func asErrors(fes []*FieldError) []error {
	out := make([]error, len(fes))
	for i, e := range fes {
		out[i] = e
	}
	return out
}

// decodeDocument decodes the tree of a text of size bytes strictly: the
// document (every field that decoded) and the problems.
func decodeDocument(root *yaml.Node, size int) (*Document, []*FieldError) {
	doc := &Document{}
	d := newDecoder(size)
	d.decode(root, reflect.ValueOf(doc).Elem())
	return doc, d.problems()
}

// parseTree returns the top-level mapping of the single document in data.
// Its errors are *FieldError, with the line where there is one.
func parseTree(data []byte) (*yaml.Node, error) {
	root, fe := parseYAML(data)
	if fe == nil {
		return root, nil
	}
	if fe.syntax && fe.Line > 0 {
		fe.Line = problemLine(data, fe)
	}
	return nil, fmt.Errorf("rules: invalid document:\n%w", fe)
}

// parseYAML is parseTree with yaml.v3's lines in syntax errors, which are
// often not the line with the mistake (see problemLine).
func parseYAML(data []byte) (*yaml.Node, *FieldError) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FieldError{Index: -1, Msg: ErrEmpty.Error(), kind: ErrEmpty}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		fe := syntaxError(err)
		fe.Msg, fe.kind = ErrMultipleDocuments.Error()+"; the next one has "+fe.Msg, ErrMultipleDocuments
		return nil, fe
	default:
		return nil, &FieldError{Index: -1, Msg: ErrMultipleDocuments.Error(), Line: extra.Line, kind: ErrMultipleDocuments}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, &FieldError{Index: -1, Msg: ErrEmpty.Error(), Line: root.Line, kind: ErrEmpty}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &FieldError{Index: -1, Line: root.Line, Msg: "the top level must be a mapping with version and rules, got " + describeNode(root)}
	}
	return root, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError is a yaml.v3 parse error as a FieldError with its line.
func syntaxError(err error) *FieldError {
	msg := err.Error()
	fe := &FieldError{Index: -1, syntax: true}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		fe.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	fe.Msg = "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")
	return fe
}

// problemLine finds the line of a syntax error. yaml.v3 names the line
// where the construct it was reading began, counted from 0 for parser
// errors ("line 3" for an unclosed "[" on line 4; for a mis-indented key
// on line 5, the line of the list it broke). The mistake is on the first
// line at which the text stops parsing with that same message: it is
// searched from yaml.v3's line on, a few lines at most, each try a parse
// of the text up to that line (only for documents that do not parse).
func problemLine(data []byte, fe *FieldError) int {
	const maxTries = 20
	start := 0 // offset of line fe.Line
	for line := 1; line < fe.Line; line++ {
		i := bytes.IndexByte(data[start:], '\n')
		if i < 0 {
			return fe.Line
		}
		start += i + 1
	}
	end := start
	for line := fe.Line; line < fe.Line+maxTries && end < len(data); line++ {
		if i := bytes.IndexByte(data[end:], '\n'); i >= 0 {
			end += i + 1
		} else {
			end = len(data)
		}
		if _, got := parseYAML(data[:end]); got != nil && got.syntax && got.Msg == fe.Msg {
			return line
		}
	}
	return fe.Line
}

// checkVersion requires version: SchemaVersion, before the strict decode:
// a newer schema would otherwise surface as a confusing pile of
// unknown-field errors.
func checkVersion(root *yaml.Node) error {
	fe := &FieldError{Index: -1, Field: versionField(), Line: root.Line, kind: ErrUnsupportedVersion}
	v := resolve(mappingValue(root, fe.Field))
	if v == nil {
		fe.Msg = fmt.Sprintf("required (want %d)", SchemaVersion)
		return fmt.Errorf("rules: invalid document:\n%w", fe)
	}
	n, err := strconv.Atoi(v.Value)
	if v.Kind != yaml.ScalarNode || err != nil || n != SchemaVersion {
		fe.Line, fe.Msg = v.Line, fmt.Sprintf("unsupported document version %s (want %d)", describeNode(v), SchemaVersion)
		return fmt.Errorf("rules: invalid document:\n%w", fe)
	}
	return nil
}

// fieldErrors are the *FieldError leaves of err (nil, one, or joined).
func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *FieldError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// coveredBy reports whether a decode problem already speaks of fe's field
// (or of a field containing it, or of one inside it): a value that did not
// decode is left zero, and "must be > 0" would only repeat "want an
// integer".
func coveredBy(fe *FieldError, decoded []*FieldError) bool {
	for _, d := range decoded {
		if d.Index != fe.Index {
			continue
		}
		if d.Field == "" || within(fe.Field, d.Field) || within(d.Field, fe.Field) {
			return true
		}
	}
	return false
}

// within reports whether field is path or inside it ("match.hosts[1]" is
// within "match.hosts" and "match").
func within(field, path string) bool {
	rest, ok := strings.CutPrefix(field, path)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// locate finds the line of fe's field in the tree: the deepest node its
// path reaches (the rule itself for a field it does not write).
func locate(root *yaml.Node, fe *FieldError) int {
	n := root
	if fe.Index >= 0 {
		rules := resolve(mappingValue(root, rulesField()))
		if rules == nil || rules.Kind != yaml.SequenceNode || fe.Index >= len(rules.Content) {
			return root.Line
		}
		n = resolve(rules.Content[fe.Index])
	}
	for part := range strings.SplitSeq(fe.Field, ".") {
		name, idx, _ := strings.Cut(part, "[")
		next := resolve(mappingValue(n, name))
		if next == nil {
			break
		}
		n = next
		if idx != "" {
			i, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			if err != nil || n.Kind != yaml.SequenceNode || i >= len(n.Content) {
				break
			}
			n = resolve(n.Content[i])
		}
	}
	return n.Line
}

// mappingValue is the value of key in mapping m (nil if m is no mapping or
// has no such key).
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
