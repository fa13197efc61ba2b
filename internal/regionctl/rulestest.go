package regionctl

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgeguard/edgeguard/internal/ruletest"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// The command registers itself so the command table stays as it is.
func init() { commands["rules test"] = (*app).rulesTest }

// testFlags are --tests and --lint-errors, on rules validate and push.
type testFlags struct {
	file       string
	lintErrors bool
}

func (t *testFlags) register(fs *flag.FlagSet, tests bool) {
	if tests {
		fs.StringVar(&t.file, "tests", "", "rule test `FILE` to run against the document first (its rules: field is not read); any failing case refuses")
	}
	fs.BoolVar(&t.lintErrors, "lint-errors", false, "refuse (exit 4) when a lint warns, not only warn")
}

// rules test [--lint-errors] FILE...
func (a *app) rulesTest(args []string) error {
	fs := a.flags("rules test", "[--lint-errors] FILE...")
	var tf testFlags
	tf.register(fs, false)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("rules test takes one or more FILEs")
	}
	results := make([]map[string]any, len(pos))
	codes := make([]int, len(pos))
	for i, f := range pos {
		results[i], codes[i] = a.runTests(f, "", nil, tf.lintErrors)
	}
	code := combine(codes)
	if a.json() {
		out := map[string]any{"pass": code == ExitOK, "files": results}
		if code != ExitOK {
			out["exit_code"], out["reason"] = code, reasonOf(code)
		}
		a.emitJSON(out)
	}
	if code == ExitOK {
		return nil
	}
	return reported(code, fmt.Sprintf("rule tests failed in %d of %s", count(boolsOf(codes)...), plural(len(pos), "file")))
}

func boolsOf(codes []int) []bool {
	out := make([]bool, len(codes))
	for i, c := range codes {
		out[i] = c != ExitOK
	}
	return out
}

// runTests runs the rule test file path against doc, the document named
// docName (nil: the rules file the test file names), lints the rules, and
// prints what came of it: each case passed or failed (with what it
// expected and got), then the lints' warnings. The exit code is ExitOK when
// every case passed (and, with lintErrors, nothing warned), ExitInvalid
// when not or when the test file is invalid, ExitError when it cannot be
// read.
func (a *app) runTests(path, docName string, doc *rules.Document, lintErrors bool) (map[string]any, int) {
	fail := func(code int, msg string) (map[string]any, int) {
		if !a.json() {
			fmt.Fprintln(a.stderr, "regionctl: "+msg)
		}
		return map[string]any{"file": path, "pass": false, "error": msg, "exit_code": code, "reason": reasonOf(code)}, code
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fail(ExitError, fmt.Sprintf("reading rule test file: %v", err))
	}
	f, err := ruletest.Parse(data)
	if err != nil {
		return fail(ExitInvalid, fmt.Sprintf("%s: invalid rule test file: %s", path, oneLine(err)))
	}
	if doc == nil {
		if f.Rules == "" {
			return fail(ExitInvalid, path+": names no rules file (rules: PATH), so it only runs with rules validate --tests or rules push --tests")
		}
		docName = filepath.Join(filepath.Dir(path), f.Rules)
		if _, doc, err = a.readRulesFile(docName, ""); err != nil {
			return fail(exitCode(err), fmt.Sprintf("%s: its rules: %s", path, oneLine(err)))
		}
	}
	results, err := ruletest.Run(f, doc)
	if err != nil {
		return fail(ExitInvalid, fmt.Sprintf("%s: %s", path, oneLine(err)))
	}
	warnings, err := ruletest.Lint(doc)
	if err != nil {
		return fail(ExitInvalid, fmt.Sprintf("%s: %s", docName, oneLine(err)))
	}
	failed := 0
	for _, r := range results {
		if !r.Pass {
			failed++
		}
	}
	code := ExitOK
	if failed > 0 || (lintErrors && len(warnings) > 0) {
		code = ExitInvalid
	}
	if a.json() {
		out := map[string]any{"file": path, "rules": docName, "pass": code == ExitOK, "cases": results,
			"passed": len(results) - failed, "failed": failed, "warnings": warnings}
		if warnings == nil {
			out["warnings"] = []ruletest.Warning{}
		}
		if code != ExitOK {
			out["exit_code"], out["reason"] = code, reasonOf(code)
		}
		return out, code
	}
	a.printf("%s: %s against %s\n", path, plural(len(results), "case"), docName)
	for _, r := range results {
		if r.Pass {
			a.printf("  PASS  %s\n", r.Name)
			continue
		}
		a.printf("  FAIL  %s\n", r.Name)
		for _, d := range r.Diffs {
			a.printf("          %s\n", d)
		}
	}
	for _, w := range warnings {
		fmt.Fprintf(a.stderr, "regionctl: %s: warning: %s\n", docName, w)
	}
	a.printf("%s: %d of %s passed", path, len(results)-failed, plural(len(results), "case"))
	if len(warnings) > 0 {
		a.printf(", %s", plural(len(warnings), "lint warning"))
		if lintErrors {
			a.printf(" (--lint-errors: failing)")
		}
	}
	a.printf("\n")
	return nil, code
}

// checkTests runs --tests against the document file holds, for validate
// and push, or, without --tests, lints it (warnings on stderr; in JSON,
// into out when given): nil when the cases pass and, with --lint-errors,
// nothing warns.
func (a *app) checkTests(t testFlags, file string, doc *rules.Document, tail string, out map[string]any) error {
	if t.file != "" {
		res, code := a.runTests(t.file, file, doc, t.lintErrors)
		if out != nil && res != nil {
			out["tests"] = res
		} else if a.json() && res != nil && code != ExitOK {
			a.emitJSON(res)
		}
		if code != ExitOK {
			msg := fmt.Sprintf("%s: the rule tests of %s failed%s", file, t.file, tail)
			if !a.json() {
				fmt.Fprintln(a.stderr, "regionctl: "+msg)
			}
			return reported(code, msg)
		}
		return nil
	}
	warnings, err := ruletest.Lint(doc)
	if err != nil {
		return invalidf("%s: %s%s", file, oneLine(err), tail)
	}
	if out != nil && len(warnings) > 0 {
		out["warnings"] = warnings
	}
	if !a.json() {
		for _, w := range warnings {
			fmt.Fprintf(a.stderr, "regionctl: %s: warning: %s\n", file, w)
		}
	}
	if t.lintErrors && len(warnings) > 0 {
		msg := fmt.Sprintf("%s: %s (--lint-errors)%s", file, plural(len(warnings), "lint warning"), tail)
		if !a.json() {
			fmt.Fprintln(a.stderr, "regionctl: "+msg)
		}
		return reported(ExitInvalid, msg)
	}
	return nil
}
