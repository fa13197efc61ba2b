package rules

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
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

	byID := make(map[string]Rule, len(g.Rules)+len(r.Rules))
	for _, rule := range g.Rules {
		if !rule.Disabled {
			byID[rule.ID] = rule
		}
	}
	for _, rule := range r.Rules {
		if rule.Disabled {
			delete(byID, rule.ID)
			continue
		}
		byID[rule.ID] = rule
	}
	// A region's behaviour section replaces the global one as a whole.
	bh := g.Behaviour
	if r.Behaviour != nil {
		bh = r.Behaviour
	}
	return &Document{Version: SchemaVersion, Rules: sortedRules(byID), Behaviour: bh}, nil
}

func sortedRules(byID map[string]Rule) []Rule {
	out := make([]Rule, 0, len(byID))
	for _, r := range byID {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rule) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
