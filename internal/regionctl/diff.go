package regionctl

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// ruleDiff is the rule-level difference between two documents, by id.
type ruleDiff struct {
	Added   []string      `json:"added"`
	Removed []string      `json:"removed"`
	Changed []changedRule `json:"changed"`
}

type changedRule struct {
	ID     string        `json:"id"`
	Fields []fieldChange `json:"fields"`
}

type fieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

func (d ruleDiff) empty() bool {
	return len(d.Added) == 0 && len(d.Removed) == 0 && len(d.Changed) == 0
}

// exit is the exit code of a diff: ExitOK when the rules are the same,
// ExitDiffers when they are not (already printed: nothing more to say).
func (d ruleDiff) exit() error {
	if d.empty() {
		return nil
	}
	return errDiffers
}

// diffRules compares two parsed (so normalized) documents; either may be nil.
func diffRules(old, new *rules.Document) ruleDiff {
	byID := func(d *rules.Document) map[string]rules.Rule {
		m := map[string]rules.Rule{}
		if d != nil {
			for _, r := range d.Rules {
				m[r.ID] = r
			}
		}
		return m
	}
	o, n := byID(old), byID(new)
	d := ruleDiff{Added: []string{}, Removed: []string{}, Changed: []changedRule{}}
	for id, nr := range n {
		or, ok := o[id]
		if !ok {
			d.Added = append(d.Added, id)
			continue
		}
		var fields []fieldChange
		for _, f := range rules.FieldNames() {
			if f == "id" {
				continue // the rules are paired by id
			}
			if ov, nv := rules.FieldValue(or, f), rules.FieldValue(nr, f); ov != nv {
				fields = append(fields, fieldChange{Field: f, Old: ov, New: nv})
			}
		}
		if len(fields) > 0 {
			d.Changed = append(d.Changed, changedRule{ID: id, Fields: fields})
		}
	}
	for id := range o {
		if _, ok := n[id]; !ok {
			d.Removed = append(d.Removed, id)
		}
	}
	slices.Sort(d.Added)
	slices.Sort(d.Removed)
	slices.SortFunc(d.Changed, func(a, b changedRule) int { return strings.Compare(a.ID, b.ID) })
	return d
}

func (d ruleDiff) print(w io.Writer) {
	for _, id := range d.Added {
		fmt.Fprintf(w, "+ added   rule %q\n", id)
	}
	for _, id := range d.Removed {
		fmt.Fprintf(w, "- removed rule %q\n", id)
	}
	for _, c := range d.Changed {
		parts := make([]string, len(c.Fields))
		for i, f := range c.Fields {
			parts[i] = fmt.Sprintf("%s %s -> %s", f.Field, f.Old, f.New)
		}
		fmt.Fprintf(w, "~ changed rule %q: %s\n", c.ID, strings.Join(parts, "; "))
	}
}

// errDiffers is what a diff returns when the rules differ.
var errDiffers = reported(ExitDiffers, "the rules differ")

// rulesDiffCoded is rulesDiff with diff(1)'s exit codes: 1 means the rules
// differ, so the general error, 1 elsewhere, becomes ExitDiffError.
func (a *app) rulesDiffCoded(args []string) error {
	return diffCoded(a, a.rulesDiff(args), errDiffers)
}

// diffCoded turns a diff's general error (exit 1 elsewhere) into
// ExitDiffError, leaving differs (exit 1 there) and the other codes alone.
func diffCoded(a *app, err, differs error) error {
	if err == nil || err == differs || exitCode(err) != ExitError {
		return err
	}
	var ce *codedError
	if errors.As(err, &ce) {
		c := *ce
		c.code = ExitDiffError
		return &c
	}
	return &codedError{code: ExitDiffError, err: err, msg: a.message(err)}
}
