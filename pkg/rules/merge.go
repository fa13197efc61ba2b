package rules

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Merge overlays a regional document on the global one. A region rule
// replaces the global rule with the same id as a whole (fields are not mixed);
// a region rule with disabled: true removes it; a disabled rule with no
// global counterpart simply has no effect. Either document may be nil.
// Both are validated (on copies; the inputs are not modified) and every
// problem in either is reported. The result is normalized, contains no
// disabled rules and is sorted by id, so equal inputs give equal output.
func Merge(global, region *Document) (*Document, error) {
	g, r := global.clone(), region.clone()
	var errs []error
	if err := g.validate(true); err != nil {
		errs = append(errs, fmt.Errorf("global document:\n%w", err))
	}
	if err := r.validate(true); err != nil {
		errs = append(errs, fmt.Errorf("region document:\n%w", err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("rules: merge: %w", errors.Join(errs...))
	}
	return merge(g, r), nil
}

// Effective is what an edge runs from its region's two documents: each
// parsed (an empty one is no document, and a problem names the document it
// is in), merged as Merge does, and compiled as Compile does. Each document
// is validated once, by Parse, whose documents are the caller's own,
// validated and normalized: merging and compiling them needs no copies and
// no second validation, which at 100,000 rules is a quarter of a reload
// after a push. The merged document comes with the snapshot, for the
// edge's rules cache (Marshal). It shares its lists with the snapshot:
// read it, do not change it.
func Effective(global, region []byte, opts ...CompileOption) (*Snapshot, *Document, error) {
	cfg, err := compileOptions(opts)
	if err != nil {
		return nil, nil, err
	}
	docs := [2]*Document{{Version: SchemaVersion}, {Version: SchemaVersion}}
	for i, data := range [2][]byte{global, region} {
		if len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		if docs[i], err = Parse(data); err != nil {
			return nil, nil, fmt.Errorf("%s document: %w", [2]string{"global", "region"}[i], err)
		}
	}
	merged := merge(docs[0], docs[1])
	return compile(merged, cfg), merged, nil
}

// merge is Merge of two validated and normalized documents that are the
// caller's own: the result holds their lists. It is valid too, since
// validation is of each rule, the behaviour section and repeated ids, and
// a merge repeats no id.
func merge(g, r *Document) *Document {
	// Rules are found and sorted by address, and copied once: a rule is large.
	byID := make(map[string]*Rule, len(g.Rules)+len(r.Rules))
	for _, d := range []*Document{g, r} { // ids are unique within each
		for i := range d.Rules {
			if rule := &d.Rules[i]; rule.Disabled {
				delete(byID, rule.ID)
			} else {
				byID[rule.ID] = rule
			}
		}
	}
	sorted := slices.SortedFunc(maps.Values(byID), func(a, b *Rule) int { return strings.Compare(a.ID, b.ID) })
	rules := make([]Rule, len(sorted))
	for i, rule := range sorted {
		rules[i] = *rule
	}
	// A region's behaviour section replaces the global one as a whole.
	bh := g.Behaviour
	if r.Behaviour != nil {
		bh = r.Behaviour
	}
	return &Document{Version: SchemaVersion, Rules: rules, Behaviour: bh}
}
