package rules

import (
	"errors"
	"fmt"
)

// A rules document costs at most a fixed multiple of its size to read,
// and no document can grow an edge's rules past a fixed size, however it
// is written. Two bounds hold that, here and nowhere else, for every
// reader (regionctl, "edge check", the edge's loads from a file or from
// Consul), since they all read through Parse:
//
//   - Reuse: YAML anchors, aliases and merge keys ("<<: *base") let a few
//     bytes stand for a long list, reused by every rule that names it; the
//     decoder walks yaml.v3's node tree itself, so yaml.v3's own guard
//     against excessive aliasing never runs. The decoder counts every value
//     it decodes (each scalar, list and mapping, again at each reuse)
//     against a budget of DecodeValuesPerByte per byte of the text, plus
//     DecodeValuesBase, and stops at the first value past it. Text without
//     reuse decodes to at most one value per two bytes ("[a,b]"), so the
//     budget leaves at least three values per byte for reuse: a rule of
//     40 bytes can merge a base of 100 values.
//   - Size: the document's rules, hosts, path prefixes and overrides are
//     counted (Limits), whatever wrote them. These bound what a document
//     that is only large, not clever, makes an edge hold and look through.
//
// Both are refused as errors of kind ErrTooLarge: Parse returns no
// document, so an edge keeps the rules it has (or its cached ones).
const (
	// DecodeValuesPerByte is the values a document may decode per byte of
	// its text, reuses included.
	DecodeValuesPerByte = 4
	// DecodeValuesBase is what any document may decode besides.
	DecodeValuesBase = 10_000
)

// Limits bound one document (global or regional: an edge's effective rules
// merge two). Each is at least twice what the 100,000-rule benchmark
// documents hold (BENCHMARKS.md: one host and one path prefix per rule).
const (
	// MaxRules bounds the rules list (disabled rules included).
	MaxRules = 250_000
	// MaxHosts bounds the hosts of all rules, match.hosts and bypass.hosts
	// together.
	MaxHosts = 500_000
	// MaxPathPrefixes bounds the path prefixes of all rules,
	// match.path_prefix and bypass.path_prefix together.
	MaxPathPrefixes = 500_000
	// MaxOverrides bounds the overrides (per-key limits) of all rules
	// together.
	MaxOverrides = 500_000
)

// MaxProblems is how many problems Parse lists, the first in the text;
// one more says how many it left out. A document of 100,000 empty rules
// has half a million, whose text alone would be a hundred times the
// document's.
const MaxProblems = 1000

// moreProblems counts n problems left out.
func moreProblems(n int) *FieldError {
	return &FieldError{Index: -1, Msg: fmt.Sprintf("and %d more problems, not listed", n), more: n}
}

// ErrTooLarge is the kind of the problems a document past its decoding
// budget or past one of the Limits is refused with.
var ErrTooLarge = errors.New("document too large")

func isTooLarge(fe *FieldError) bool { return fe.kind == ErrTooLarge }

// decodeBudget is the values a text of size bytes may decode.
func decodeBudget(size int) int { return DecodeValuesBase + DecodeValuesPerByte*size }

// tooLarge is a problem of kind ErrTooLarge at line (0: unknown).
func tooLarge(line int, format string, args ...any) *FieldError {
	return &FieldError{Index: -1, Line: line, Msg: fmt.Sprintf(format, args...), kind: ErrTooLarge}
}

// overBudget is the problem of a text of size bytes whose decoding went
// past its budget at line.
func overBudget(line, size int) *FieldError {
	return tooLarge(line, "the document decodes to more than %d values (%d per byte of its %d, and %d), "+
		"each reuse of an anchor (an alias or a << merge key) counted anew",
		decodeBudget(size), DecodeValuesPerByte, size, DecodeValuesBase)
}

// tooManyRules is the problem of a rules list of n items, or nil.
func tooManyRules(n, line int) *FieldError {
	if n <= MaxRules {
		return nil
	}
	return tooLarge(line, "%d rules, more than the %d a document may hold", n, MaxRules)
}

// checkLimits reports each of the Limits d goes past (nil when none).
// A document past one is not validated further: its rules are not worth
// the time.
func (d *Document) checkLimits() []error {
	var errs []error
	if fe := tooManyRules(len(d.Rules), 0); fe != nil {
		errs = append(errs, fe)
	}
	var hosts, prefixes, overrides int
	for i := range d.Rules {
		r := &d.Rules[i]
		hosts += len(r.Match.Hosts) + len(r.Bypass.Hosts)
		prefixes += len(r.Match.PathPrefix) + len(r.Bypass.PathPrefix)
		overrides += len(r.Overrides)
	}
	for _, c := range []struct {
		what     string
		n, limit int
	}{
		{"hosts (match.hosts and bypass.hosts of all rules)", hosts, MaxHosts},
		{"path prefixes (match.path_prefix and bypass.path_prefix of all rules)", prefixes, MaxPathPrefixes},
		{"overrides (of all rules)", overrides, MaxOverrides},
	} {
		if c.n > c.limit {
			errs = append(errs, tooLarge(0, "%d %s, more than the %d a document may hold", c.n, c.what, c.limit))
		}
	}
	return errs
}
