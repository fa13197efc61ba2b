package regionctl

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// rules validate [--tests FILE] [--lint-errors] FILE...
func (a *app) rulesValidate(args []string) error {
	fs := a.flags("rules validate", "[--tests FILE] [--lint-errors] FILE...")
	var tf testFlags
	tf.register(fs, true)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("rules validate takes one or more FILEs")
	}
	results := make([]map[string]any, len(pos))
	codes := make([]int, len(pos))
	for i, f := range pos {
		results[i], codes[i] = a.validateFile(f, tf)
	}
	code := combine(codes)
	if a.json() {
		if len(results) == 1 {
			a.emitJSON(results[0])
		} else {
			out := map[string]any{"valid": code == ExitOK, "documents": results}
			if code != ExitOK {
				out["exit_code"], out["reason"] = code, reasonOf(code)
			}
			a.emitJSON(out)
		}
	}
	if code == ExitOK {
		return nil
	}
	bad := 0
	for _, c := range codes {
		if c != ExitOK {
			bad++
		}
	}
	msg := fmt.Sprintf("%d of %s not valid", bad, plural(len(pos), "file"))
	if len(pos) == 1 {
		return reported(code, msg) // the file's own lines said it
	}
	return &codedError{code: code, msg: msg}
}

// validateFile checks one file: its JSON result and exit code. Text goes
// out at once: the valid line on stdout, the problems (or why the file
// could not be read) on stderr.
func (a *app) validateFile(path string, tf testFlags) (map[string]any, int) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := fmt.Sprintf("reading rules file: %v", err)
		if !a.json() {
			fmt.Fprintln(a.stderr, "regionctl: "+msg)
		}
		return map[string]any{"valid": false, "document": path, "error": msg, "exit_code": ExitError, "reason": reasonOf(ExitError)}, ExitError
	}
	doc, err := a.parseRules(data)
	if err != nil {
		probs := fileProblems(path, err)
		head := fmt.Sprintf("%s: invalid (%s)", path, plural(len(probs), "problem"))
		if !a.json() {
			fmt.Fprintln(a.stderr, "regionctl: "+head+":")
			for _, p := range probs {
				fmt.Fprintln(a.stderr, p.String())
			}
		}
		return map[string]any{"valid": false, "document": path, "problems": probs,
			"error": head, "exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)}, ExitInvalid
	}
	v := a.versionOf(data) // what a push records in history
	if !a.json() {
		a.printf("%s: valid, %s, version %s\n", path, plural(len(doc.Rules), "rule"), v)
	}
	out := map[string]any{"valid": true, "document": path, "rules": len(doc.Rules), "version": v}
	if err := a.checkTests(tf, path, doc, "", out); err != nil { // rulestest.go
		out["valid"], out["error"], out["exit_code"], out["reason"] = false, err.Error(), exitCode(err), reasonOf(exitCode(err))
		return out, exitCode(err)
	}
	return out, ExitOK
}

// docFlags are the flags that pick a region and one of its documents.
type docFlags struct {
	region string
	global bool
}

func (d *docFlags) register(fs *flag.FlagSet) {
	regionVar(fs, &d.region)
	fs.BoolVar(&d.global, "global", false, "use the region's copy of the global document instead of the region document")
}

// what names a document for humans.
func (d docFlags) what() string {
	if d.global {
		return "global document of " + d.region
	}
	return "region document of " + d.region
}

func (d docFlags) kind() string {
	if d.global {
		return region.KindGlobalRules
	}
	return region.KindRegionRules
}

func (s *session) docKey(d docFlags) string {
	if d.global {
		return s.layout.GlobalRules()
	}
	return s.layout.RegionRules(d.region)
}

// current is the stored document d names, with its ModifyIndex.
func current(docs region.Docs, d docFlags) ([]byte, uint64) {
	if d.global {
		return docs.Global, docs.GlobalIndex
	}
	return docs.Region, docs.RegionIndex
}

// with returns docs with d's document replaced by data.
func with(docs region.Docs, d docFlags, data []byte) region.Docs {
	if d.global {
		docs.Global = data
	} else {
		docs.Region = data
	}
	return docs
}

// rules get --region R [--effective|--global|--document]
func (a *app) rulesGet(args []string) error {
	fs := a.flags("rules get", "--region R [--effective|--global|--document]")
	var r string
	var effective, global, document bool
	regionVar(fs, &r)
	fs.BoolVar(&effective, "effective", false, "print the effective rules: global merged with the region document (default)")
	fs.BoolVar(&global, "global", false, "print the region's copy of the global document as stored")
	fs.BoolVar(&document, "document", false, "print the region document as stored")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("rules get takes no arguments, got %q", pos)
	}
	if n := count(effective, global, document); n > 1 {
		return usagef("--effective, --global and --document exclude each other")
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	docs, err := s.readDocs(r)
	if err != nil {
		return err
	}
	if !global && !document {
		eff, err := a.effective(docs)
		if err != nil {
			return invalidf("the stored rules of %s are invalid: %s", r, oneLine(err))
		}
		v := rules.Version(eff)
		if a.json() {
			a.emitJSON(map[string]any{"region": r, "document": "effective", "version": v,
				"global_index": docs.GlobalIndex, "region_index": docs.RegionIndex, "rules": jsonable(eff.Rules)})
			return nil
		}
		out, err := rules.Marshal(eff)
		if err != nil {
			return err
		}
		a.printf("# effective rules of %s (global document merged with the region document), version %s\n", r, v)
		a.printf("%s", out)
		return nil
	}
	d := docFlags{region: r, global: global}
	key := s.docKey(d)
	data, index := current(docs, d)
	name := "region"
	if global {
		name = "global"
	}
	if a.json() {
		out := map[string]any{"region": r, "document": name, "key": key, "present": len(data) > 0,
			"modify_index": index, "version": a.docVersion(data), "content": string(data)}
		if doc, err := a.parseStoredOnce(data); err == nil && doc != nil {
			out["rules"] = jsonable(doc.Rules)
		}
		a.emitJSON(out)
		return nil
	}
	if len(data) == 0 {
		a.printf("# no %s (%s is absent)\n", d.what(), key)
		return nil
	}
	a.printf("# %s (%s, ModifyIndex %d), version %s\n", d.what(), key, index, a.docVersion(data))
	a.printf("%s", data)
	if !strings.HasSuffix(string(data), "\n") {
		a.printf("\n")
	}
	return nil
}

// rules history --region R [--limit N] [--kind K]
func (a *app) rulesHistory(args []string) error {
	fs := a.flags("rules history", "--region R [--limit N] [--kind rules|global|region|shedder|enforcement|rls|hosts|all]")
	var r, kind string
	var limit int
	regionVar(fs, &r)
	fs.IntVar(&limit, "limit", 20, "show at most `N` entries, newest first (0: all)")
	fs.StringVar(&kind, "kind", "all", "which entries: rules (global and region), global, region, shedder, enforcement, rls (rate limit service documents), hosts or all")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("rules history takes no arguments, got %q", pos)
	}
	if limit < 0 {
		return usagef("--limit must be >= 0")
	}
	keep := map[string]func(string) bool{
		"all":         func(string) bool { return true },
		"rules":       func(k string) bool { return k == region.KindGlobalRules || k == region.KindRegionRules },
		"global":      func(k string) bool { return k == region.KindGlobalRules },
		"region":      func(k string) bool { return k == region.KindRegionRules },
		"shedder":     func(k string) bool { return k == region.KindShedder },
		"enforcement": func(k string) bool { return k == region.KindEnforcement },
		"rls":         func(k string) bool { return k == region.KindRLS },
		"hosts":       func(k string) bool { return k == region.KindHosts },
	}[kind]
	if keep == nil {
		return usagef("--kind must be rules, global, region, shedder, enforcement, rls, hosts or all, got %q", kind)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	all, err := s.history(r, "")
	if err != nil {
		return err
	}
	entries := []region.Entry{}
	for _, e := range all {
		if keep(e.Kind) && (limit == 0 || len(entries) < limit) {
			entries = append(entries, e)
		}
	}
	pruning, err := s.historyPruning(r)
	if err != nil {
		return err
	}
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "entries": entries, "stored": len(all), "retention": retentionJSON(pruning)})
		return nil
	}
	if len(entries) == 0 {
		a.printf("no history in %s\n", r)
	} else {
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tTIME\tAUTHOR\tHOST\tKIND\tVERSION\tMESSAGE")
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.UTC().Format(time.RFC3339),
				dash(e.Author), dash(e.Host), e.Kind, dash(e.Version), dash(oneLine(fmt.Errorf("%s", e.Message))))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	a.printf("\n")
	a.printRetention(r, len(all), pruning)
	return nil
}

// retentionJSON is the history retention of a region for --output json.
func retentionJSON(p region.Pruning) map[string]any {
	out := map[string]any{"keep": p.Keep, "pruned_total": p.Total, "recently_pruned": p.Recent}
	if p.Keep == 0 {
		out["keep"] = region.DefaultKeepHistory
		out["note"] = "no push has pruned yet: pushes keep the newest " + fmt.Sprint(region.DefaultKeepHistory) + " entries of each document unless --keep-history says otherwise"
	} else {
		out["last_pruned"] = p.Time
	}
	if p.Recent == nil {
		out["recently_pruned"] = []region.Entry{}
	}
	return out
}

// printRetention says how much history the region keeps and what was
// pruned.
func (a *app) printRetention(r string, stored int, p region.Pruning) {
	if p.Keep == 0 {
		a.printf("%s: %s stored; nothing pruned yet (pushes keep the newest %d entries of each document, --keep-history)\n",
			r, entries(stored, "history "), region.DefaultKeepHistory)
		return
	}
	a.printf("%s: %s stored; the last push (%s) kept the newest %d of each document (--keep-history); %s pruned in all\n",
		r, entries(stored, "history "), p.Time.UTC().Format(time.RFC3339), p.Keep, entries(p.Total, ""))
	if len(p.Recent) == 0 {
		return
	}
	a.printf("most recently pruned:\n")
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	for _, e := range p.Recent[:min(len(p.Recent), 10)] {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.UTC().Format(time.RFC3339), dash(e.Author), e.Kind, dash(e.Version))
	}
	_ = tw.Flush()
	if n := len(p.Recent) - 10; n > 0 {
		a.printf("  … and %d more (see --output json)\n", n)
	}
}

// rules diff --region R [--global] FILE
func (a *app) rulesDiff(args []string) error {
	fs := a.flags("rules diff", "--region R [--global] FILE | OLD NEW")
	var d docFlags
	d.register(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 2 && d.region == "" && !d.global:
		return a.diffFiles(pos[0], pos[1])
	case len(pos) == 2:
		return usagef("rules diff OLD NEW compares two files and takes no --region or --global")
	case len(pos) != 1:
		return usagef("rules diff takes FILE (with --region) or two FILEs")
	}
	file := pos[0]
	data, doc, err := a.readRulesFile(file, "")
	if err != nil {
		return err
	}
	s, err := a.connectRegion(d.region)
	if err != nil {
		return err
	}
	defer s.close()
	docs, err := s.readDocs(d.region)
	if err != nil {
		return err
	}
	stored, _ := current(docs, d)
	old, err := a.parseStoredOnce(stored)
	if err != nil {
		return invalidf("the stored %s is invalid: %s", d.what(), oneLine(err))
	}
	diff := diffRules(old, doc)
	before, errBefore := a.effectiveVersion(docs)
	after, errAfter := a.effectiveVersion(with(docs, d, data))
	if errBefore != nil {
		before = "invalid"
	}
	if errAfter != nil {
		after = "invalid"
	}
	if a.json() {
		out := map[string]any{"region": d.region, "document": docName(d), "key": s.docKey(d), "file": file,
			"identical": diff.empty(), "added": diff.Added, "removed": diff.Removed, "changed": diff.Changed,
			"effective_version_before": before, "effective_version_after": after}
		if errAfter != nil {
			out["effective_error"] = oneLine(errAfter)
		}
		a.emitJSON(out)
		return diff.exit()
	}
	if diff.empty() {
		note := ""
		if string(stored) != string(data) {
			note = " (the texts differ only in formatting, comments or spelling)"
		}
		a.printf("no changes: %s has the same rules as the %s%s; effective version %s\n", file, d.what(), note, before)
		return nil
	}
	a.printf("--- %s (%s)\n+++ %s\n", d.what(), s.docKey(d), file)
	diff.print(a.stdout)
	a.printf("effective rules version of %s: %s -> %s\n", d.region, dash(before), dash(after))
	if errAfter != nil {
		a.printf("warning: the effective rules would be invalid: %s\n", oneLine(errAfter))
	}
	return diff.exit()
}

// diffFiles is "rules diff OLD NEW": two files, no Consul.
func (a *app) diffFiles(oldFile, newFile string) error {
	oldData, old, err := a.readRulesFile(oldFile, "")
	if err != nil {
		return err
	}
	newData, doc, err := a.readRulesFile(newFile, "")
	if err != nil {
		return err
	}
	diff := diffRules(old, doc)
	vOld, vNew := a.versionOf(oldData), a.versionOf(newData)
	if a.json() {
		a.emitJSON(map[string]any{"old": oldFile, "new": newFile, "identical": diff.empty(),
			"added": diff.Added, "removed": diff.Removed, "changed": diff.Changed,
			"version_old": vOld, "version_new": vNew})
		return diff.exit()
	}
	if diff.empty() {
		note := ""
		if string(oldData) != string(newData) {
			note = " (the texts differ only in formatting, comments or spelling)"
		}
		a.printf("no changes: %s has the same rules as %s%s; version %s\n", newFile, oldFile, note, vNew)
		return nil
	}
	a.printf("--- %s\n+++ %s\n", oldFile, newFile)
	diff.print(a.stdout)
	a.printf("version: %s -> %s\n", vOld, vNew)
	return diff.exit()
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine flattens a multi-line error into one line.
func oneLine(err error) string {
	var b strings.Builder
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		switch s := b.String(); {
		case s == "":
		case strings.HasSuffix(s, ":"):
			b.WriteString(" ")
		default:
			b.WriteString("; ")
		}
		b.WriteString(l)
	}
	return b.String()
}
