package rules

import (
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
	return &Document{Version: SchemaVersion, Rules: rules, Behaviour: bh}, nil
}
