package rules

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// Parse errors that callers may want to tell apart.
var (
	ErrEmpty              = errors.New("empty document")
	ErrMultipleDocuments  = errors.New("multiple YAML documents; want exactly one")
	ErrUnsupportedVersion = errors.New("unsupported document version")
)

// Parse decodes one rules document strictly and validates it. Unknown fields,
// duplicate keys, bad durations and every validation problem are reported;
// the returned document is normalized (see Validate).
func Parse(data []byte) (*Document, error) {
	doc := scanDocument(data) // the subset rule sets are written in
	if doc == nil {
		doc = parsePieces(data) // a large plain document, in pieces
	}
	if doc == nil {
		var err error
		if doc, err = parseWhole(data); err != nil {
			return nil, err
		}
	}
	if err := doc.validate(true); err != nil {
		return nil, fmt.Errorf("rules: invalid document:\n%w", err)
	}
	return doc, nil
}

// parseWhole parses and decodes data as one tree.
func parseWhole(data []byte) (*Document, error) {
	root, err := parseTree(data)
	if err != nil {
		return nil, err
	}
	// Check the version before the strict decode: a newer schema would
	// otherwise surface as a confusing pile of unknown-field errors.
	if err := checkVersion(root); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}

	// One YAML parse: the tree is decoded as it is, and checked for unknown
	// fields here (what Decoder.KnownFields does, which a yaml.Node cannot
	// be asked for), rather than parsing the text a second time.
	var doc Document
	if err := decodeTree(root, &doc); err != nil {
		return nil, fmt.Errorf("rules: decode: %w", err)
	}
	return &doc, nil
}

// parseTree returns the top-level mapping of the single document in data.
func parseTree(data []byte) (*yaml.Node, error) {
	if root := parseTreeParallel(data); root != nil {
		return root, nil
	}
	return parseTreeSerial(data)
}

func parseTreeSerial(data []byte) (*yaml.Node, error) {
	return parseTreeReader(bytes.NewReader(data))
}

func parseTreeReader(r io.Reader) (*yaml.Node, error) {
	dec := yaml.NewDecoder(r)
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("rules: %w", ErrEmpty)
		}
		return nil, fmt.Errorf("rules: decode: %w", err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("rules: %w: %w", ErrMultipleDocuments, err)
	default:
		return nil, fmt.Errorf("rules: %w", ErrMultipleDocuments)
	}

	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, fmt.Errorf("rules: %w", ErrEmpty)
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("rules: line %d: top level must be a mapping with version and rules", root.Line)
	}
	return root, nil
}

func checkVersion(root *yaml.Node) error {
	v := mappingValue(root, "version")
	if v == nil {
		return fmt.Errorf("%w: version is required (want %d)", ErrUnsupportedVersion, SchemaVersion)
	}
	n, err := strconv.Atoi(v.Value)
	if v.Kind != yaml.ScalarNode || err != nil || n != SchemaVersion {
		return fmt.Errorf("%w: line %d: version %q (want %d)", ErrUnsupportedVersion, v.Line, v.Value, SchemaVersion)
	}
	return nil
}

// defaultCost sets Cost to 1 for rules that omit it. After the strict decode
// an omitted cost and "cost: 0" look the same and only the latter is a
// mistake, so a second, lenient decode of the tree tells them apart (through
// anchors and merge keys too).
func defaultCost(root *yaml.Node, doc *Document) {
	var costs struct {
		Rules []struct {
			Cost *int64 `yaml:"cost"`
		} `yaml:"rules"`
	}
	if err := root.Decode(&costs); err != nil || len(costs.Rules) != len(doc.Rules) {
		return // the strict decode already succeeded; this cannot really happen
	}
	for i, c := range costs.Rules {
		if c.Cost == nil {
			doc.Rules[i].Cost = 1
		}
	}
}

var (
	documentType  = reflect.TypeFor[Document]()
	knownFieldsMu sync.Mutex
	knownFieldsOf = map[reflect.Type]map[string]reflect.Type{}
)

// fieldsOf maps a struct type's YAML field names to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	knownFieldsMu.Lock()
	defer knownFieldsMu.Unlock()
	if m, ok := knownFieldsOf[t]; ok {
		return m
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case !f.IsExported() || name == "-":
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		m[name] = f.Type
	}
	knownFieldsOf[t] = m
	return m
}

// unknownFields lists, as yaml.v3's strict decoder words them, the mapping
// keys in n that t (a struct type, or a slice of one) has no field for,
// following aliases and merge keys as the decoder does.
func unknownFields(n *yaml.Node, t reflect.Type, out []string) []string {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n == nil {
		return out
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for _, c := range n.Content {
			out = unknownFields(c, t.Elem(), out)
		}
		return out
	case t.Kind() != reflect.Struct || n.Kind != yaml.MappingNode:
		return out
	case reflect.PointerTo(t).Implements(yamlUnmarshaler):
		return out // decodes itself
	}
	fields := fieldsOf(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			if v.Kind == yaml.SequenceNode {
				for _, m := range v.Content {
					out = unknownFields(m, t, out)
				}
			} else {
				out = unknownFields(v, t, out)
			}
			continue
		}
		ft, ok := fields[k.Value]
		if !ok {
			out = append(out, fmt.Sprintf("line %d: field %s not found in type %s", k.Line, k.Value, t))
			continue
		}
		out = unknownFields(v, ft, out)
	}
	return out
}

var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// mergeTypeErrors adds unknown-field errors to err (nil or a decode error),
// in line order, as one *yaml.TypeError when err is one.
func mergeTypeErrors(err error, unknown []string) error {
	var te *yaml.TypeError
	switch {
	case err == nil:
		te = &yaml.TypeError{}
	case errors.As(err, &te):
	default:
		return err // a hard decode error says enough
	}
	all := append(slices.Clone(te.Errors), unknown...)
	slices.SortStableFunc(all, func(a, b string) int { return cmp.Compare(lineOf(a), lineOf(b)) })
	return &yaml.TypeError{Errors: all}
}

// lineOf is N in "line N: ..." (0 when absent).
func lineOf(msg string) int {
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return 0
	}
	num, _, _ := strings.Cut(rest, ":")
	n, _ := strconv.Atoi(num)
	return n
}

func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := m.Content[i+1]
			if v.Kind == yaml.AliasNode && v.Alias != nil {
				v = v.Alias
			}
			return v
		}
	}
	return nil
}
