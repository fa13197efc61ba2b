package rules

import "fmt"

// FieldError is one validation problem. Validate joins all of them with
// errors.Join; use errors.As to pick them apart (e.g. in the CLI).
type FieldError struct {
	RuleID string // empty when the rule has no usable id
	Index  int    // position in Document.Rules; -1 for document-level problems
	Field  string // e.g. "limit", "match.hosts[1]", "key[0]"
	Msg    string
}

func (e *FieldError) Error() string {
	switch {
	case e.Index < 0:
		return e.Field + ": " + e.Msg
	case e.RuleID != "":
		return fmt.Sprintf("rule %q: %s: %s", e.RuleID, e.Field, e.Msg)
	default:
		return fmt.Sprintf("rules[%d]: %s: %s", e.Index, e.Field, e.Msg)
	}
}

// problems collects FieldErrors for one rule.
type problems struct {
	id    string
	index int
	errs  []error
}

func (p *problems) addf(field, format string, args ...any) {
	p.errs = append(p.errs, &FieldError{RuleID: p.id, Index: p.index, Field: field, Msg: fmt.Sprintf(format, args...)})
}
