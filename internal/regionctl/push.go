package regionctl

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// oneByOne is said whenever a push targets several regions.
const oneByOne = "Regions are written one by one, not in one transaction: " +
	"if a region fails, the regions before it keep the new document and the ones after it are still written."

// meta is who pushes, from where and why, and how much history to keep.
type meta struct {
	author, host, message string
	keep                  int
}

func (a *app) metaFlags(fs *flag.FlagSet) *meta {
	m := &meta{}
	fs.StringVar(&m.message, "message", "", "history `message` for this push")
	fs.StringVar(&m.author, "author", "", "history author (default $USER)")
	fs.IntVar(&m.keep, "keep-history", region.DefaultKeepHistory,
		"after the push, keep the newest `N` history entries of each document in the region and delete older ones (0: keep all)")
	return m
}

func (a *app) fillMeta(m *meta) error {
	if m.keep < 0 {
		return usagef("--keep-history must be >= 0 (0 keeps all), got %d", m.keep)
	}
	if m.author == "" {
		m.author = a.env("USER")
	}
	if m.author == "" {
		m.author = "unknown"
	}
	if h, err := os.Hostname(); err == nil {
		m.host = h
	}
	return nil
}

// pushResult is one region's outcome.
type pushResult struct {
	Region          string `json:"region"`
	Document        string `json:"document"` // global, region or shedder
	Key             string `json:"key"`
	Status          string `json:"status"` // ok, unchanged, or the failure reason (conflict, invalid, ...)
	DocumentVersion string `json:"document_version,omitempty"`
	Version         string `json:"version,omitempty"`          // effective rules version after the push
	PreviousVersion string `json:"previous_version,omitempty"` // effective rules version before
	Seq             string `json:"seq,omitempty"`              // history entry
	HistoryPruned   int    `json:"history_pruned,omitempty"`   // history entries deleted by --keep-history
	PartsCollected  int    `json:"parts_collected,omitempty"`  // unreferenced parts deleted after the push
	PartsPending    int    `json:"parts_pending,omitempty"`    // unreferenced parts kept until the edges converge
	Warning         string `json:"warning,omitempty"`
	Error           string `json:"error,omitempty"`
	ExitCode        int    `json:"exit_code"`
}

// plan is one region's push, read and checked but not yet written.
type plan struct {
	d          docFlags
	key        string
	data       []byte
	docVersion string
	index      uint64 // check-and-set index: the ModifyIndex just read
	cur        []byte // the document now (whole)
	curVersion string // its document version ("" when absent)
	before     string // effective version now
	after      string // effective version once written
	unchanged  bool
	// empty: once written, the region's effective rules hold no rule
	// (every rule cleared), which takes --allow-empty.
	empty bool
	// storedInParts: the document being replaced is stored in parts, so
	// the push may leave parts for CollectParts.
	storedInParts bool
	// converged: every healthy edge of the region ran the effective rules
	// KV held when the push was planned, so none is still loading an older
	// version's parts (see collect).
	converged bool
	err       error
}

// plan reads region d.region's documents and checks that writing data as
// d's document leaves a valid effective rule set.
func (s *session) plan(d docFlags, data []byte, version string) plan {
	p := plan{d: d, key: s.docKey(d), data: data, docVersion: version}
	docs, err := s.readDocs(d.region)
	if err != nil {
		p.err = err
		return p
	}
	cur, index := current(docs, d)
	p.index, p.cur, p.curVersion = index, cur, s.a.docVersion(cur)
	p.unchanged = bytes.Equal(cur, data)
	p.storedInParts = len(cur) > region.InlineMax
	if p.before, err = s.a.effectiveVersion(docs); err != nil {
		p.before = "invalid"
	}
	if after, err := s.a.effective(with(docs, d, data)); err != nil {
		p.err = invalidf("the effective rules of %s would be invalid: %s", d.region, oneLine(err))
	} else {
		p.after, p.empty = rules.Version(after), len(after.Rules) == 0
	}
	p.converged = p.err == nil && s.convergedOn(d.region, p.before)
	return p
}

// convergedOn reports whether every healthy edge of region r runs version
// (true when none is registered). An error listing the edges counts as not
// converged: it only delays collecting parts.
func (s *session) convergedOn(r, version string) bool {
	if version == "invalid" {
		return false
	}
	edges, err := s.edges(r)
	if err != nil {
		return false
	}
	for _, e := range edges {
		if e.Healthy && e.Region == r && e.RulesVersion != version {
			return false
		}
	}
	return true
}

// write pushes a plan (check-and-set on the index read by plan).
func (s *session) write(p plan, m meta) pushResult {
	res := pushResult{Region: p.d.region, Document: docName(p.d), Key: p.key,
		DocumentVersion: p.docVersion, Version: p.after, PreviousVersion: p.before}
	if p.err != nil {
		return s.failed(res, p.err)
	}
	if p.unchanged {
		res.Status = "unchanged"
		return res
	}
	e, err := s.push(p.d.region, p.key, p.data, p.index, region.Entry{
		Kind: p.d.kind(), Version: p.docVersion, Author: m.author, Host: m.host, Message: m.message,
	})
	if err != nil {
		return s.failed(res, err)
	}
	res.Status, res.Seq = "ok", e.Seq
	s.afterPush(&res, m, len(p.data) > region.InlineMax || p.storedInParts, p.converged)
	return res
}

// afterPush applies the history retention (--keep-history) to the region
// and, where parts may have lost their last manifest (a document in parts
// written or replaced, history entries pruned), deletes the parts no
// manifest names: only when the region's edges had converged on what the
// push replaced, since an edge still loading it might be reading them.
// Otherwise they stay, counted as pending, for a later push to collect.
// Failures here are warnings: the push itself has landed.
func (s *session) afterPush(res *pushResult, m meta, parts, converged bool) {
	var warnings []string
	pruned, err := s.pruneHistory(res.Region, m.keep)
	res.HistoryPruned = len(pruned)
	if err != nil {
		warnings = append(warnings, "pruning history: "+s.a.message(err))
	}
	if parts || len(pruned) > 0 {
		var warn string
		if converged {
			res.PartsCollected, warn = s.collectParts(res.Region)
		} else {
			res.PartsPending, warn = s.unnamedParts(res.Region)
		}
		if warn != "" {
			warnings = append(warnings, warn)
		}
	}
	res.Warning = strings.Join(warnings, "; ")
}

func (s *session) failed(res pushResult, err error) pushResult {
	res.ExitCode = exitCode(err)
	res.Status = reasonOf(res.ExitCode)
	res.Error = s.a.message(err)
	if res.ExitCode == ExitConflict {
		res.Error = fmt.Sprintf("%s; nothing was written to %s, re-run to retry", res.Error, res.Region)
	}
	res.Version = ""
	return res
}

func docName(d docFlags) string {
	if d.global {
		return "global"
	}
	return "region"
}

// line is a result in text form.
func (r pushResult) line(verb string) string {
	switch r.Status {
	case "ok":
		line := fmt.Sprintf("%s: ok: %s, document version %s; effective rules version %s -> %s",
			r.Region, verb, r.DocumentVersion, dash(r.PreviousVersion), r.Version)
		if r.HistoryPruned > 0 {
			line += fmt.Sprintf("; pruned %s (keeping the newest of each document)", entries(r.HistoryPruned, "history "))
		}
		if r.PartsCollected > 0 {
			line += fmt.Sprintf("; deleted %s no manifest names", plural(r.PartsCollected, "stored part"))
		}
		if r.PartsPending > 0 {
			line += fmt.Sprintf("; %s no manifest names kept until the edges of %s converge (a later push deletes them)",
				plural(r.PartsPending, "stored part"), r.Region)
		}
		if r.Warning != "" {
			line += "; warning: " + r.Warning
		}
		return line
	case "unchanged":
		return fmt.Sprintf("%s: unchanged: the %s document already holds it; effective rules version %s",
			r.Region, r.Document, r.Version)
	}
	return fmt.Sprintf("%s: %s: %s", r.Region, r.Status, r.Error)
}

// rules push (--region R [--global] | --all) FILE
func (a *app) rulesPush(args []string) error {
	fs := a.flags("rules push", "(--region R [--global] | --all) [--message M] [--author A] [--expect-version V] [--dry-run] [--yes] [--allow-empty] [--canary POP (with --all: REGION/POP) --for DURATION] FILE")
	var d docFlags
	var all bool
	d.register(fs)
	fs.BoolVar(&all, "all", false, "write FILE as the global document into every region, one by one")
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	sf.allowEmptyFlag(fs)
	var tf testFlags
	tf.register(fs, true)
	cf := a.canaryFlags(fs, "the region document, or with --global the global one; with --all, --canary REGION/POP runs it in one region before every region is written")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if cf.pop != "" {
		if err := cf.check(all, sf.prometheus); err != nil {
			return err
		}
	}
	switch {
	case len(pos) != 1:
		return usagef("rules push takes one FILE")
	case all && d.region != "":
		return usagef("--all and --region exclude each other")
	case !all && d.region == "":
		return usagef("rules push needs --region R (or --all for the global document in every region)")
	}
	file := pos[0]
	data, doc, err := a.readRulesFile(file, "; nothing was written")
	if err != nil {
		return err
	}
	if tf.file != "" || tf.lintErrors {
		if err := a.checkTests(tf, file, doc, "; nothing was written", nil); err != nil { // rulestest.go
			return err
		}
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connect()
	if err != nil {
		return err
	}
	defer s.close()

	var targets []docFlags
	if all {
		rs, err := s.allRegions()
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return errors.New("consul lists no datacenters")
		}
		for _, r := range rs {
			targets = append(targets, docFlags{region: r, global: true})
		}
	} else {
		if err := s.checkRegion(d.region); err != nil {
			return err
		}
		targets = []docFlags{d}
	}
	switch {
	case cf.pop != "" && all:
		if err := s.checkRegion(cf.region); err != nil {
			return err
		}
		return a.allCanaryPush(s, targets, data, *m, sf, cf, file)
	case cf.pop != "":
		return a.canaryPush(s, d, data, *m, sf, cf, file)
	}
	return a.pushAll(s, targets, data, a.versionOf(data), *m, sf, file, all, "wrote "+file)
}

// pushAll plans every target, refuses everything when any target's
// effective rules would be invalid, then writes the targets one by one.
func (a *app) pushAll(s *session, targets []docFlags, data []byte, docVersion string, m meta, sf *safety, file string, many bool, verb string) error {
	plans, done, err := a.planAll(s, targets, data, docVersion, m, sf, file)
	if err != nil || done {
		return err
	}
	return a.writeAll(s, plans, m, file, many, verb)
}

// planAll plans every target and applies the push's checks before anything
// is written: any target's effective rules invalid refuses them all, then
// --allow-empty, --expect-version and the dry run or the confirmation.
// done: nothing more to do (a dry run).
func (a *app) planAll(s *session, targets []docFlags, data []byte, docVersion string, m meta, sf *safety, file string) (plans []plan, done bool, err error) {
	plans = make([]plan, len(targets))
	var invalid []pushResult
	for i, t := range targets {
		plans[i] = s.plan(t, data, docVersion)
		if isInvalid(plans[i].err) {
			invalid = append(invalid, s.write(plans[i], m)) // write refuses: p.err is set
		}
	}
	if len(invalid) > 0 {
		head := fmt.Sprintf("refusing to push %s: nothing was written", file)
		if a.json() {
			a.emitJSON(map[string]any{"file": file, "status": "invalid", "error": head, "results": invalid,
				"exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
		}
		fmt.Fprintln(a.stderr, "regionctl: "+head+":")
		for _, r := range invalid {
			fmt.Fprintln(a.stderr, "  "+r.Error)
		}
		return nil, false, reported(ExitInvalid, head)
	}
	if err := a.refuseEmpty(plans, sf, file); err != nil {
		return nil, false, err
	}
	if err := a.guard(s, plans, sf, file); err != nil || sf.dryRun {
		return nil, true, err
	}
	return plans, false, nil
}

// writeAll writes plans one by one and reports each region's result.
func (a *app) writeAll(s *session, plans []plan, m meta, file string, many bool, verb string) error {
	if many && !a.json() {
		names := make([]string, len(plans))
		for i, p := range plans {
			names[i] = p.d.region
		}
		a.printf("Pushing %s as the global document to %s (%s).\n%s\n",
			file, plural(len(plans), "region"), strings.Join(names, ", "), oneByOne)
	}
	results := make([]pushResult, 0, len(plans))
	codes := make([]int, 0, len(plans))
	var failed []string
	for _, p := range plans {
		r := s.write(p, m)
		results = append(results, r)
		codes = append(codes, r.ExitCode)
		if r.ExitCode != ExitOK {
			failed = append(failed, r.Region+" ("+r.Status+")")
		}
		if !a.json() && (many || r.ExitCode == ExitOK) {
			a.printf("%s\n", r.line(verb))
		}
	}
	code := combine(codes)
	if a.json() {
		out := map[string]any{"file": file, "results": results, "exit_code": code, "reason": reasonOf(code)}
		if many {
			out["note"] = oneByOne
		}
		a.emitJSON(out)
	}
	switch {
	case code == ExitOK:
		if many && !a.json() {
			a.printf("all %s done\n", plural(len(results), "region"))
		}
		return nil
	case !many:
		return &codedError{code: code, msg: results[0].Error}
	}
	head := fmt.Sprintf("%d of %s failed: %s", len(failed), plural(len(results), "region"), strings.Join(failed, ", "))
	if !a.json() {
		a.printf("%s\n", head)
	}
	return &codedError{code: code, msg: head}
}

// refuseEmpty refuses, unless --allow-empty, a push that leaves a region
// with no rule at all (a dry run of one too: it shows what the push does). Edges keep their rules when the documents are
// absent (a Consul rebuilt empty must not switch a region off), so an
// explicit empty document is the one way to clear them, and one a slip
// (the wrong file, a generator that produced nothing) must not take.
func (a *app) refuseEmpty(plans []plan, sf *safety, file string) error {
	if sf == nil || sf.allowEmpty {
		return nil
	}
	var regions []string
	for _, p := range plans {
		if p.err == nil && !p.unchanged && p.empty {
			regions = append(regions, p.d.region)
		}
	}
	if len(regions) == 0 {
		return nil
	}
	head := fmt.Sprintf("refusing to push %s: it leaves %s with no rules at all, so the region's edges would limit nothing; "+
		"to clear every rule, push it again with --allow-empty; nothing was written", file, strings.Join(regions, ", "))
	if a.json() {
		a.emitJSON(map[string]any{"file": file, "status": "invalid", "error": head, "regions": regions,
			"exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
	}
	fmt.Fprintln(a.stderr, "regionctl: "+head)
	return reported(ExitInvalid, head)
}

// rules rollback --region R [--global] [--to VERSION]
func (a *app) rulesRollback(args []string) error {
	fs := a.flags("rules rollback", "--region R [--global] [--to VERSION] [--message M] [--author A] [--expect-version V] [--dry-run] [--yes] [--allow-empty]")
	var d docFlags
	var to string
	d.register(fs)
	fs.StringVar(&to, "to", "", "document `version` (or history seq) to restore; default: the previous one")
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	sf.allowEmptyFlag(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("rules rollback takes no arguments, got %q", pos)
	}
	if err := a.fillMeta(m); err != nil {
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
	cur, _ := current(docs, d)
	key := s.docKey(d)
	hist, err := s.history(d.region, d.kind())
	if err != nil {
		return err
	}
	target := rollbackTarget(hist, key, to, func(doc string) bool { return region.SameDocument(doc, cur) })
	if target == nil {
		if to != "" {
			return fmt.Errorf("no %s with version %q in the history of %s (see rules history --region %s)", d.what(), to, d.region, d.region)
		}
		return fmt.Errorf("no earlier version of the %s in its history: nothing to roll back to", d.what())
	}
	data, err := s.resolve(d.region, []byte(target.Document))
	if err != nil {
		return fmt.Errorf("history entry %s: %w", target.Seq, err)
	}
	parsed := a.parseOnce(data)
	if parsed.err != nil {
		return invalidf("history entry %s holds an invalid document: %s", target.Seq, oneLine(parsed.err))
	}
	version := parsed.version
	msg := "rollback to " + version
	if m.message != "" {
		msg += ": " + m.message
	}
	m.message = msg
	verb := fmt.Sprintf("rolled the %s document back to %s (pushed %s by %s)",
		docName(d), target.Seq, target.Time.UTC().Format(time.RFC3339), dash(target.Author))
	return a.pushAll(s, []docFlags{d}, data, version, *m, sf, "history entry "+target.Seq, false, verb)
}

// rollbackTarget is the history entry of key a rollback restores: the one
// named by to (a version or a history seq), or with no to the newest whose
// document differs from what is stored (isCurrent). Nil: none.
func rollbackTarget(hist []region.Entry, key, to string, isCurrent func(doc string) bool) *region.Entry {
	for i := range hist {
		e := &hist[i]
		if e.Key != key {
			continue
		}
		if to != "" && (e.Version == to || e.Seq == to) || to == "" && !isCurrent(e.Document) {
			return e
		}
	}
	return nil
}
