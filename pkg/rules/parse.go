package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

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
	root, err := parseTree(data)
	if err != nil {
		return nil, err
	}
	// Check the version before the strict decode: a newer schema would
	// otherwise surface as a confusing pile of unknown-field errors.
	if err := checkVersion(root); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("rules: decode: %w", err)
	}
	defaultCost(root, &doc)

	if err := doc.Validate(); err != nil {
		return nil, fmt.Errorf("rules: invalid document:\n%w", err)
	}
	return &doc, nil
}

// parseTree returns the top-level mapping of the single document in data.
func parseTree(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
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
