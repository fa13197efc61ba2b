package rules

import (
	"fmt"
	"strconv"
)

// FieldError is one problem with a document: a field that does not decode
// (unknown, repeated, of the wrong kind) or does not validate. Parse and
// Validate join all of them with errors.Join; use errors.As to pick them
// apart (e.g. in the CLI).
type FieldError struct {
	RuleID string // empty when the rule has no usable id
	Index  int    // position in Document.Rules; -1 for document-level problems
	Field  string // e.g. "limit", "match.hosts[1]", "key[0]"; empty for the rule or document as a whole
	Msg    string
	// Line is where the problem is in the document text (1-based); 0 when
	// unknown (a document built in Go, or a YAML error without a line).
	Line int
	// kind is the named error this problem is an instance of (ErrEmpty,
	// ErrMultipleDocuments, ErrUnsupportedVersion), for errors.Is.
	kind error
	// syntax marks a YAML syntax error, whose line parseTree corrects.
	syntax bool
	// more, in a problem that only counts others (moreProblems), is how
	// many were left out.
	more int
}

// Unwrap returns the named error the problem is an instance of, if any.
func (e *FieldError) Unwrap() error { return e.kind }

func (e *FieldError) Error() string {
	s := ""
	if e.Line > 0 {
		s = "line " + strconv.Itoa(e.Line) + ": "
	}
	return s + e.problem()
}

// Located is the problem as compilers print one, after the file that
// holds the document: "FILE:LINE: rule "ID": FIELD: message" ("FILE: ..."
// when the line is unknown), the form "regionctl rules validate" and
// "edge check" print.
func (e *FieldError) Located(file string) string {
	if e.Line > 0 {
		return file + ":" + strconv.Itoa(e.Line) + ": " + e.problem()
	}
	return file + ": " + e.problem()
}

// problem is the error without its line.
func (e *FieldError) problem() string {
	s := ""
	switch {
	case e.Index < 0:
	case e.RuleID != "":
		s = fmt.Sprintf("rule %q: ", e.RuleID)
	default:
		s = fmt.Sprintf("%s[%d]: ", rulesField(), e.Index)
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Msg
}

// FieldErrors returns the *FieldError problems err holds (Parse, Validate
// and Compile join them with errors.Join), in order; none when err holds
// none.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// problems collects FieldErrors for one rule.
type problems struct {
	rule  *Rule
	id    string
	index int
	errs  []error
	quota *quota // shared by the rules validated in turn; nil: no bound
}

// quota is the problems a run of rules may still list (limits.go,
// MaxProblems), and the count of those it could not.
type quota struct{ left, dropped int }

// take reports whether one more problem may be listed, counting it
// dropped when not.
func (q *quota) take() bool {
	if q == nil {
		return true
	}
	if q.left <= 0 {
		q.dropped++
		return false
	}
	q.left--
	return true
}

func (p *problems) addf(field, format string, args ...any) {
	if !p.quota.take() {
		return
	}
	p.errs = append(p.errs, &FieldError{RuleID: p.id, Index: p.index, Field: field, Msg: fmt.Sprintf(format, args...)})
}
