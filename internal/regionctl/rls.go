package regionctl

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// The rate limit service's configuration: envoyproxy/ratelimit's YAML
// documents, one domain each (docs/envoy.md), read by pkg/rlsconfig.

// rlsProblem is one problem of a rate limit service document, in JSON.
type rlsProblem struct {
	File       string `json:"file"`
	Line       int    `json:"line,omitempty"`
	Descriptor string `json:"descriptor,omitempty"`
	Field      string `json:"field,omitempty"`
	Message    string `json:"message"`
}

// rlsProblems flattens a Parse or Compile error into its problems.
func rlsProblems(err error) []rlsProblem {
	var out []rlsProblem
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var e *rlsconfig.Error
		if errors.As(err, &e) {
			out = append(out, rlsProblem{File: e.File, Line: e.Line, Descriptor: e.Path, Field: e.Field, Message: e.Msg})
			return
		}
		out = append(out, rlsProblem{Message: err.Error()})
	}
	walk(err)
	return out
}

func (p rlsProblem) String() string {
	if p.File == "" {
		return p.Message
	}
	return (&rlsconfig.Error{File: p.File, Line: p.Line, Path: p.Descriptor, Field: p.Field, Msg: p.Message}).Error()
}

// rlsFiles expands the arguments: a directory stands for every document
// under it, as the edge's --rls-config-dir reads it.
func rlsFiles(args []string) ([]string, error) {
	var files []string
	for _, arg := range args {
		st, err := os.Stat(arg)
		if err != nil {
			return nil, fmt.Errorf("reading rate limit configuration: %w", err)
		}
		if !st.IsDir() {
			files = append(files, arg)
			continue
		}
		fs, err := rlsconfig.Files(arg)
		if err != nil {
			return nil, err
		}
		if len(fs) == 0 {
			// An edge serves an empty directory (every descriptor OK), but
			// regionctl never validates or pushes nothing.
			return nil, fmt.Errorf("reading rate limit configuration: no .yaml or .yml file under %s", arg)
		}
		files = append(files, fs...)
	}
	return files, nil
}

// countDescriptors counts the descriptors of a tree, every level.
func countDescriptors(ds []rlsconfig.Descriptor) int {
	n := len(ds)
	for _, d := range ds {
		n += countDescriptors(d.Descriptors)
	}
	return n
}

// rlsSet is a set of documents read for validate or diff.
type rlsSet struct {
	docs    []*rlsconfig.Document
	results []map[string]any // per file, for JSON
	code    int              // combined exit code of the files
	bad     int              // files not valid
}

// readRLS parses every file, printing each one's verdict (text: valid
// lines on stdout, problems on stderr) unless quiet.
func (a *app) readRLS(files []string, quiet bool) rlsSet {
	var s rlsSet
	codes := make([]int, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			msg := fmt.Sprintf("reading rate limit configuration: %v", err)
			if !a.json() {
				fmt.Fprintln(a.stderr, "regionctl: "+msg)
			}
			s.results = append(s.results, map[string]any{"valid": false, "document": f, "error": msg,
				"exit_code": ExitError, "reason": reasonOf(ExitError)})
			codes[i] = ExitError
			s.bad++
			continue
		}
		doc, err := rlsconfig.Parse(f, data)
		if err != nil {
			probs := rlsProblems(err)
			head := fmt.Sprintf("%s: invalid (%s)", f, plural(len(probs), "problem"))
			if !a.json() {
				fmt.Fprintln(a.stderr, "regionctl: "+head+":")
				for _, p := range probs {
					fmt.Fprintln(a.stderr, p.String())
				}
			}
			s.results = append(s.results, map[string]any{"valid": false, "document": f, "problems": probs,
				"error": head, "exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
			codes[i] = ExitInvalid
			s.bad++
			continue
		}
		n := countDescriptors(doc.Descriptors)
		if !a.json() && !quiet {
			a.printf("%s: valid, domain %s, %s\n", f, doc.Domain, plural(n, "descriptor"))
		}
		s.results = append(s.results, map[string]any{"valid": true, "document": f, "domain": doc.Domain, "descriptors": n})
		s.docs = append(s.docs, doc)
	}
	s.code = combine(codes)
	return s
}

// rls validate [--merge-domains] FILE|DIR...
func (a *app) rlsValidate(args []string) error {
	fs := a.flags("rls validate", "[--merge-domains] FILE|DIR...")
	merge := fs.Bool("merge-domains", false, "documents of one domain are merged, as the edge's --rls-merge-domains does (else refused)")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("rls validate takes one or more FILEs or DIRs")
	}
	files, err := rlsFiles(pos)
	if err != nil {
		return err
	}
	s := a.readRLS(files, false)
	// The documents together, as one edge would load them: one domain
	// twice, or a descriptor declared twice across merged documents.
	var together []rlsProblem
	if s.bad == 0 {
		if _, err := rlsconfig.Compile(s.docs, *merge); err != nil {
			together = rlsProblems(err)
			s.code = ExitInvalid
			if !a.json() {
				fmt.Fprintf(a.stderr, "regionctl: the documents together: invalid (%s):\n", plural(len(together), "problem"))
				for _, p := range together {
					fmt.Fprintln(a.stderr, p.String())
				}
			}
		}
	}
	if a.json() {
		out := map[string]any{"valid": s.code == ExitOK, "documents": s.results}
		if together != nil {
			out["problems"] = together
		}
		if s.code != ExitOK {
			out["exit_code"], out["reason"] = s.code, reasonOf(s.code)
		}
		a.emitJSON(out)
	}
	switch {
	case s.code == ExitOK:
		return nil
	case together != nil:
		return reported(s.code, "the documents are not valid together")
	case len(files) == 1:
		return reported(s.code, "not valid")
	}
	return &codedError{code: s.code, msg: fmt.Sprintf("%d of %s not valid", s.bad, plural(len(files), "file"))}
}

// loadRLS reads and compiles one side of a diff: a file or a directory.
func (a *app) loadRLS(arg string, merge bool) (*rlsconfig.Config, error) {
	files, err := rlsFiles([]string{arg})
	if err != nil {
		return nil, err
	}
	s := a.readRLS(files, true)
	if s.code != ExitOK {
		if a.json() {
			a.emitJSON(map[string]any{"valid": false, "documents": s.results, "exit_code": s.code, "reason": reasonOf(s.code)})
		}
		return nil, reported(s.code, fmt.Sprintf("%s: not valid", arg))
	}
	c, err := rlsconfig.Compile(s.docs, merge)
	if err != nil {
		probs := rlsProblems(err)
		head := fmt.Sprintf("%s: invalid (%s)", arg, plural(len(probs), "problem"))
		if a.json() {
			a.emitJSON(map[string]any{"valid": false, "document": arg, "problems": probs,
				"error": head, "exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
		}
		fmt.Fprintln(a.stderr, "regionctl: "+head+":")
		for _, p := range probs {
			fmt.Fprintln(a.stderr, p.String())
		}
		return nil, reported(ExitInvalid, head)
	}
	return c, nil
}

// limitFields are a limit's settings as a diff shows them.
func limitFields(l rlsconfig.Limit) [][2]string {
	rate := "-"
	switch {
	case l.Unlimited:
		rate = "unlimited"
	case l.Unit != rlsconfig.UnitNone:
		rate = fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
	case l.Window > 0:
		rate = fmt.Sprintf("%d per %s", l.RequestsPerUnit, l.Window)
	}
	burst := "-"
	if l.Burst > 0 {
		burst = strconv.FormatInt(l.Burst, 10)
	}
	return [][2]string{
		{"rate", rate},
		{"algorithm", l.Algorithm.String()},
		{"burst", burst},
		{"shadow_mode", strconv.FormatBool(l.Shadow)},
		{"quota_mode", strconv.FormatBool(l.Quota)},
		{"share_threshold", strconv.FormatBool(l.Share)},
		{"name", dash(l.Name)},
		{"replaces", dash(strings.Join(l.Replaces, ","))},
	}
}

// limitDiff is the difference between two configurations, limit by limit
// (a limit is named by its descriptor path, domain first).
type limitDiff struct {
	// DomainsAdded and DomainsRemoved: a domain without limits still
	// changes answers (an unknown domain is an error to Envoy).
	DomainsAdded   []string `json:"domains_added"`
	DomainsRemoved []string `json:"domains_removed"`

	Added   []string      `json:"added"`
	Removed []string      `json:"removed"`
	Changed []changedRule `json:"changed"`
}

func (d limitDiff) empty() bool {
	return len(d.DomainsAdded) == 0 && len(d.DomainsRemoved) == 0 &&
		len(d.Added) == 0 && len(d.Removed) == 0 && len(d.Changed) == 0
}

func diffLimits(old, new *rlsconfig.Config) limitDiff {
	byPath := func(c *rlsconfig.Config) map[string]rlsconfig.Limit {
		m := map[string]rlsconfig.Limit{}
		for _, l := range c.Limits() {
			m[l.Path] = l
		}
		return m
	}
	o, n := byPath(old), byPath(new)
	d := limitDiff{DomainsAdded: []string{}, DomainsRemoved: []string{}, Added: []string{}, Removed: []string{}, Changed: []changedRule{}}
	for _, dom := range new.Domains() {
		if !old.HasDomain(dom) {
			d.DomainsAdded = append(d.DomainsAdded, dom)
		}
	}
	for _, dom := range old.Domains() {
		if !new.HasDomain(dom) {
			d.DomainsRemoved = append(d.DomainsRemoved, dom)
		}
	}
	for path, nl := range n {
		ol, ok := o[path]
		if !ok {
			d.Added = append(d.Added, path)
			continue
		}
		of, nf := limitFields(ol), limitFields(nl)
		var fields []fieldChange
		for i := range of {
			if of[i][1] != nf[i][1] {
				fields = append(fields, fieldChange{Field: of[i][0], Old: of[i][1], New: nf[i][1]})
			}
		}
		if len(fields) > 0 {
			d.Changed = append(d.Changed, changedRule{ID: path, Fields: fields})
		}
	}
	for path := range o {
		if _, ok := n[path]; !ok {
			d.Removed = append(d.Removed, path)
		}
	}
	slices.Sort(d.Added)
	slices.Sort(d.Removed)
	slices.SortFunc(d.Changed, func(a, b changedRule) int { return strings.Compare(a.ID, b.ID) })
	return d
}

func (d limitDiff) print(w io.Writer, oldC, newC *rlsconfig.Config) {
	byPath := func(c *rlsconfig.Config) map[string]rlsconfig.Limit {
		m := map[string]rlsconfig.Limit{}
		for _, l := range c.Limits() {
			m[l.Path] = l
		}
		return m
	}
	o, n := byPath(oldC), byPath(newC)
	for _, dom := range d.DomainsAdded {
		fmt.Fprintf(w, "+ added   domain %s\n", dom)
	}
	for _, dom := range d.DomainsRemoved {
		fmt.Fprintf(w, "- removed domain %s\n", dom)
	}
	for _, p := range d.Added {
		fmt.Fprintf(w, "+ added   limit %s: %s\n", p, fieldsLine(n[p]))
	}
	for _, p := range d.Removed {
		fmt.Fprintf(w, "- removed limit %s: %s\n", p, fieldsLine(o[p]))
	}
	for _, c := range d.Changed {
		parts := make([]string, len(c.Fields))
		for i, f := range c.Fields {
			parts[i] = fmt.Sprintf("%s %s -> %s", f.Field, f.Old, f.New)
		}
		fmt.Fprintf(w, "~ changed limit %s: %s\n", c.ID, strings.Join(parts, "; "))
	}
}

// fieldsLine is a limit's rate and the settings that differ from the
// defaults, on one line.
func fieldsLine(l rlsconfig.Limit) string {
	fs := limitFields(l)
	parts := []string{fs[0][1], fs[1][1]}
	for _, f := range fs[2:] {
		if f[1] != "-" && f[1] != "false" {
			parts = append(parts, f[0]+" "+f[1])
		}
	}
	return strings.Join(parts, ", ")
}

// errLimitsDiffer is what rls diff returns when the limits differ.
var errLimitsDiffer = reported(ExitDiffers, "the limits differ")

// rls diff [--merge-domains] OLD NEW, with diff(1)'s exit codes.
func (a *app) rlsDiff(args []string) error {
	return diffCoded(a, a.rlsDiffFiles(args), errLimitsDiffer)
}

func (a *app) rlsDiffFiles(args []string) error {
	fs := a.flags("rls diff", "[--merge-domains] OLD NEW")
	merge := fs.Bool("merge-domains", false, "documents of one domain are merged, as the edge's --rls-merge-domains does (else refused)")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("rls diff takes OLD and NEW, each a FILE or a DIR")
	}
	oldC, err := a.loadRLS(pos[0], *merge)
	if err != nil {
		return err
	}
	newC, err := a.loadRLS(pos[1], *merge)
	if err != nil {
		return err
	}
	d := diffLimits(oldC, newC)
	if a.json() {
		a.emitJSON(map[string]any{"old": pos[0], "new": pos[1], "identical": d.empty(),
			"domains_added": d.DomainsAdded, "domains_removed": d.DomainsRemoved,
			"added": d.Added, "removed": d.Removed, "changed": d.Changed})
	} else if d.empty() {
		a.printf("no changes: %s has the same limits as %s (%s)\n", pos[1], pos[0], plural(len(newC.Limits()), "limit"))
	} else {
		a.printf("--- %s\n+++ %s\n", pos[0], pos[1])
		d.print(a.stdout, oldC, newC)
	}
	if d.empty() {
		return nil
	}
	return errLimitsDiffer
}

// rlsVersion names a document's content in history: 12 hex digits of its
// SHA-256.
func rlsVersion(doc []byte) string {
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:])[:12]
}
