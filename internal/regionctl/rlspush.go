package regionctl

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// The commands that change a region's rate limit service documents —
// push, rm and rollback — share one path: plan each region's change
// (documents after it, validated together; the limit-level diff), refuse
// everything when any region would be left invalid, show and confirm, then
// write region by region, each in one check-and-set transaction with its
// history entries, and apply the history retention.

// rlsChange is what a command does to a region's documents: put (name →
// content) and remove names.
type rlsChange struct {
	put    map[string][]byte
	remove []string
}

// rlsPlan is one region's change, read and checked but not yet written.
type rlsPlan struct {
	region     string
	writes     []region.RLSWrite
	oldC, newC *rlsconfig.Config
	oldErr     error // the stored documents do not compile
	diff       limitDiff
	probs      []rlsProblem // the documents after the change are invalid
}

// planRLS reads region r's documents and checks what ch leaves there.
func (a *app) planRLS(s *session, r string, ch rlsChange, merge bool, m meta) (rlsPlan, error) {
	ctx, cancel := s.ctx()
	stored, err := s.c.ReadRLS(ctx, r)
	cancel()
	if err != nil {
		return rlsPlan{}, need(err, fmt.Sprintf("key read on %s in %s", s.layout.RLS(r), r))
	}
	// Before and after, as the region's edges would load them: each
	// document named by its key.
	compile := func(docs map[string][]byte) (*rlsconfig.Config, error) {
		var parsed []*rlsconfig.Document
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(docs)) {
			d, err := rlsconfig.Parse(s.layout.RLSDoc(r, name), docs[name])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			parsed = append(parsed, d)
		}
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return rlsconfig.Compile(parsed, merge)
	}
	p := rlsPlan{region: r}
	after := maps.Clone(stored.Docs)
	for _, n := range slices.Sorted(maps.Keys(ch.put)) {
		data := ch.put[n]
		after[n] = data
		if old, ok := stored.Docs[n]; ok && bytes.Equal(old, data) {
			continue
		}
		p.writes = append(p.writes, region.RLSWrite{Name: n, Doc: data, Index: stored.Index[n],
			Entry: region.Entry{Version: rlsVersion(data), Author: m.author, Host: m.host, Message: m.message}})
	}
	for _, n := range ch.remove {
		if _, ok := stored.Docs[n]; !ok {
			return rlsPlan{}, fmt.Errorf("%s holds no rate limit service document %s (see rls get --region %s)", r, n, r)
		}
		delete(after, n)
		p.writes = append(p.writes, region.RLSWrite{Name: n, Delete: true, Index: stored.Index[n],
			Entry: region.Entry{Author: m.author, Host: m.host, Message: m.message}})
	}
	if len(after) > 0 {
		if p.newC, err = compile(after); err != nil {
			p.probs = rlsProblems(err)
		}
	} else {
		p.newC, _ = rlsconfig.Compile(nil, false) // none left: edges answer UNAVAILABLE
	}
	if p.oldC, p.oldErr = compile(stored.Docs); p.oldErr != nil || len(stored.Docs) == 0 {
		p.oldC, _ = rlsconfig.Compile(nil, false) // shown against nothing
	}
	if p.probs == nil {
		p.diff = diffLimits(p.oldC, p.newC)
	}
	return p, nil
}

// show prints what the plan writes and the limits it changes.
func (p rlsPlan) show(w io.Writer, s *session) {
	if p.oldErr != nil {
		fmt.Fprintf(w, "%s: the stored documents are invalid (edges keep what they run); the diff is against none\n", p.region)
	}
	for _, wr := range p.writes {
		if wr.Delete {
			fmt.Fprintf(w, "%s: remove %s\n", p.region, s.layout.RLSDoc(p.region, wr.Name))
			continue
		}
		fmt.Fprintf(w, "%s: write %s (version %s)\n", p.region, s.layout.RLSDoc(p.region, wr.Name), wr.Entry.Version)
	}
	p.diff.print(w, p.oldC, p.newC)
}

// result is the plan's outcome for JSON.
func (p rlsPlan) result() map[string]any {
	return map[string]any{"region": p.region, "written": []string{}, "unchanged": len(p.writes) == 0,
		"domains_added": p.diff.DomainsAdded, "domains_removed": p.diff.DomainsRemoved,
		"added": p.diff.Added, "removed": p.diff.Removed, "changed": p.diff.Changed}
}

// applyRLS plans ch in every region of targets and writes it. what names
// the change in messages ("rls push", say).
func (a *app) applyRLS(s *session, targets []string, ch rlsChange, w *rlsWrite, what string) error {
	merge, m, dryRun, yes := w.merge, *w.meta, w.dryRun, w.yes
	plans := make([]rlsPlan, len(targets))
	var invalid []map[string]any
	for i, r := range targets {
		p, err := a.planRLS(s, r, ch, merge, m)
		if err != nil {
			return err
		}
		plans[i] = p
		if p.probs != nil {
			head := fmt.Sprintf("the documents of %s after %s: invalid (%s); nothing was written", r, what, plural(len(p.probs), "problem"))
			fmt.Fprintln(a.stderr, "regionctl: "+head+":")
			for _, pr := range p.probs {
				fmt.Fprintln(a.stderr, pr.String())
			}
			invalid = append(invalid, map[string]any{"valid": false, "region": r, "problems": p.probs, "error": head,
				"exit_code": ExitInvalid, "reason": reasonOf(ExitInvalid)})
		}
	}
	many := len(targets) > 1
	emit := func(results []map[string]any) {
		if !many {
			a.emitJSON(results[0])
			return
		}
		a.emitJSON(map[string]any{"results": results, "note": oneByOne})
	}
	if len(invalid) > 0 {
		if a.json() {
			emit(invalid)
		}
		if many {
			return &codedError{code: ExitInvalid, msg: fmt.Sprintf("%d of %s would be left invalid; nothing was written", len(invalid), plural(len(targets), "region"))}
		}
		return reported(ExitInvalid, invalid[0]["error"].(string))
	}
	var pending []rlsPlan
	for _, p := range plans {
		if len(p.writes) > 0 {
			pending = append(pending, p)
		}
	}
	showAll := func(w io.Writer) {
		for _, p := range pending {
			p.show(w, s)
		}
	}
	results := make([]map[string]any, len(plans))
	for i, p := range plans {
		results[i] = p.result()
	}
	switch {
	case len(pending) == 0:
		if a.json() {
			emit(results)
			return nil
		}
		for _, p := range plans {
			a.printf("%s: unchanged: the region already holds these documents\n", p.region)
		}
		return nil
	case dryRun:
		if a.json() {
			for _, r := range results {
				r["dry_run"] = true
			}
			emit(results)
			return nil
		}
		showAll(a.stdout)
		a.printf("dry run: nothing was written\n")
		return nil
	}
	if !yes {
		n := 0
		for _, p := range pending {
			n += len(p.writes)
		}
		if err := a.confirm(showAll, fmt.Sprintf("Write %s to %s?", plural(n, "rate limit service document change"), strings.Join(regionsOf(pending), ", "))); err != nil {
			return err
		}
	}
	if many && !a.json() {
		a.printf("%s to %s (%s).\n%s\n", what, plural(len(targets), "region"), strings.Join(targets, ", "), oneByOne)
	}
	var codes []int
	var failed []string
	for i, p := range plans {
		if len(p.writes) == 0 {
			if !a.json() {
				a.printf("%s: unchanged: the region already holds these documents\n", p.region)
			}
			continue
		}
		if a.beforeWrite != nil {
			a.beforeWrite(p.region)
		}
		entries, err := s.pushRLS(p.region, p.writes)
		if err != nil {
			code := exitCode(err)
			codes = append(codes, code)
			failed = append(failed, p.region)
			results[i]["error"], results[i]["exit_code"], results[i]["reason"] = a.message(err), code, reasonOf(code)
			if !many {
				if a.json() {
					emit(results)
				}
				return err
			}
			if !a.json() {
				a.printf("%s: failed: %s\n", p.region, a.message(err))
			}
			continue
		}
		var written []string
		for _, e := range entries {
			written = append(written, e.Key)
		}
		results[i]["written"] = written
		// Retention, as after every push: a failure is a warning, the
		// documents are written.
		pruned, perr := s.pruneHistory(p.region, m.keep)
		results[i]["history_pruned"] = len(pruned)
		if perr != nil {
			results[i]["warning"] = "applying history retention: " + a.message(perr)
			fmt.Fprintf(a.stderr, "regionctl: warning: %s: applying history retention: %s\n", p.region, a.message(perr))
		}
		if a.json() {
			continue
		}
		p.show(a.stdout, s)
		for j, e := range entries {
			if p.writes[j].Delete {
				a.printf("%s: ok: removed %s (history %s)\n", p.region, e.Key, e.Seq)
				continue
			}
			a.printf("%s: ok: wrote %s (version %s, history %s)\n", p.region, e.Key, e.Version, e.Seq)
		}
	}
	if a.json() {
		emit(results)
	}
	if len(failed) > 0 {
		return &codedError{code: combine(codes), msg: fmt.Sprintf("%d of %s failed: %s", len(failed), plural(len(targets), "region"), strings.Join(failed, ", "))}
	}
	return nil
}

func regionsOf(ps []rlsPlan) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.region
	}
	return out
}

// rlsTargets is --region R, or every region with --all.
func (a *app) rlsTargets(s *session, r string, all bool) ([]string, error) {
	if !all {
		return []string{r}, s.checkRegion(r)
	}
	rs, err := s.allRegions()
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, errors.New("consul lists no datacenters")
	}
	return rs, nil
}

// rls push (--region R | --all) [--merge-domains] FILE|DIR...
func (a *app) rlsPush(args []string) error {
	fs := a.flags("rls push", "(--region R | --all) [--merge-domains] [--message M] [--author A] [--keep-history N] [--dry-run] [--yes] FILE|DIR...\n\n"+
		"Writes each FILE as rls/R/<its base name>; the region's other documents stay. Each FILE, then the region's\n"+
		"documents as they would be after the push, are validated first; nothing is written if any is invalid.\n"+
		"All FILEs are written in one transaction, each checked against the index read (check-and-set).\n"+
		"--all does this in every region, one by one, after checking every region first.")
	var r string
	var all bool
	regionVar(fs, &r)
	fs.BoolVar(&all, "all", false, "write the FILEs into every region, one by one")
	w := a.rlsWriteFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("rls push takes one or more FILEs or DIRs")
	}
	if err := regionOrAll("rls push", r, all); err != nil {
		return err
	}
	if err := a.fillMeta(w.meta); err != nil {
		return err
	}
	files, err := rlsFiles(pos)
	if err != nil {
		return err
	}
	names := map[string]string{} // name → file
	for _, f := range files {
		n := filepath.Base(f)
		if prev, dup := names[n]; dup {
			return usagef("%s and %s would both be written as %s", prev, f, n)
		}
		names[n] = f
	}
	set := a.readRLS(files, true)
	if set.code != ExitOK {
		if a.json() {
			a.emitJSON(map[string]any{"valid": false, "documents": set.results, "exit_code": set.code, "reason": reasonOf(set.code)})
		}
		return reported(set.code, fmt.Sprintf("%d of %s not valid; nothing was written", set.bad, plural(len(files), "file")))
	}
	ch := rlsChange{put: map[string][]byte{}}
	for n, f := range names {
		if ch.put[n], err = os.ReadFile(f); err != nil {
			return fmt.Errorf("reading rate limit configuration: %w", err)
		}
	}
	s, err := a.connect()
	if err != nil {
		return err
	}
	defer s.close()
	targets, err := a.rlsTargets(s, r, all)
	if err != nil {
		return err
	}
	return a.applyRLS(s, targets, ch, w, "rls push")
}

// rls rm (--region R | --all) [--merge-domains] NAME...
func (a *app) rlsRm(args []string) error {
	fs := a.flags("rls rm", "(--region R | --all) [--merge-domains] [--message M] [--author A] [--keep-history N] [--dry-run] [--yes] NAME...\n\n"+
		"Removes the documents rls/R/NAME (check-and-set, a history entry each, one transaction); the region's\n"+
		"other documents are validated without them first. rls rollback brings a removed document back.")
	var r string
	var all bool
	regionVar(fs, &r)
	fs.BoolVar(&all, "all", false, "remove the NAMEs from every region, one by one (each region must hold them)")
	w := a.rlsWriteFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("rls rm takes one or more document NAMEs (see rls get)")
	}
	if err := regionOrAll("rls rm", r, all); err != nil {
		return err
	}
	for _, n := range pos {
		if n == "" || strings.Contains(n, "/") {
			return usagef("%q is not a document name (the part of the key after rls/R/)", n)
		}
	}
	if err := a.fillMeta(w.meta); err != nil {
		return err
	}
	s, err := a.connect()
	if err != nil {
		return err
	}
	defer s.close()
	targets, err := a.rlsTargets(s, r, all)
	if err != nil {
		return err
	}
	return a.applyRLS(s, targets, rlsChange{remove: slices.Compact(slices.Sorted(slices.Values(pos)))}, w, "rls rm")
}

// rls rollback --region R [--to VERSION] NAME
func (a *app) rlsRollback(args []string) error {
	fs := a.flags("rls rollback", "--region R [--to VERSION] [--merge-domains] [--message M] [--author A] [--keep-history N] [--dry-run] [--yes] NAME\n\n"+
		"Restores document NAME of R from its history: the newest version unlike the one stored (a removed document\n"+
		"comes back; one whose earlier state is \"absent\" is removed), or the given version or history seq.")
	var r, to string
	regionVar(fs, &r)
	fs.StringVar(&to, "to", "", "document `version` (or history seq) to restore; default: the previous one")
	w := a.rlsWriteFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("rls rollback takes one document NAME")
	}
	name := pos[0]
	if err := a.fillMeta(w.meta); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	cur, _, err := s.get(r, s.layout.RLSDoc(r, name))
	if err != nil {
		return err
	}
	hist, err := s.history(r, region.KindRLS)
	if err != nil {
		return err
	}
	key := s.layout.RLSDoc(r, name)
	target := rollbackTarget(hist, key, to, func(doc string) bool { return doc == string(cur) })
	if target == nil {
		if to != "" {
			return fmt.Errorf("no version %q of %s in the history of %s (see rules history --region %s --kind rls)", to, key, r, r)
		}
		return fmt.Errorf("no earlier version of %s in its history: nothing to roll back to", key)
	}
	ch := rlsChange{put: map[string][]byte{name: []byte(target.Document)}}
	restored := "version " + target.Version
	if target.Document == "" {
		ch, restored = rlsChange{remove: []string{name}}, "absent"
	}
	msg := fmt.Sprintf("rollback to %s (history %s, pushed %s by %s)", restored, target.Seq, target.Time.UTC().Format(time.RFC3339), dash(target.Author))
	if w.meta.message != "" {
		msg += ": " + w.meta.message
	}
	w.meta.message = msg
	return a.applyRLS(s, []string{r}, ch, w, "rls rollback")
}

// rls get --region R [NAME]
func (a *app) rlsGet(args []string) error {
	fs := a.flags("rls get", "--region R [NAME]")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("rls get takes at most one document NAME, got %q", pos)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := s.ctx()
	stored, err := s.c.ReadRLS(ctx, r)
	cancel()
	if err != nil {
		return need(err, fmt.Sprintf("key read on %s in %s", s.layout.RLS(r), r))
	}
	names := slices.Sorted(maps.Keys(stored.Docs))
	if len(pos) == 1 {
		if _, ok := stored.Docs[pos[0]]; !ok {
			return fmt.Errorf("%s holds no rate limit service document %s (%s)", r, pos[0], strings.Join(names, ", "))
		}
		names = pos
	}
	if a.json() {
		docs := []map[string]any{}
		for _, n := range names {
			d := map[string]any{"name": n, "key": s.layout.RLSDoc(r, n), "modify_index": stored.Index[n],
				"version": rlsVersion(stored.Docs[n]), "content": string(stored.Docs[n])}
			if doc, err := rlsconfig.Parse(n, stored.Docs[n]); err == nil {
				d["domain"] = doc.Domain
			} else {
				d["problems"] = rlsProblems(err)
			}
			docs = append(docs, d)
		}
		a.emitJSON(map[string]any{"region": r, "prefix": s.layout.RLS(r), "documents": docs})
		return nil
	}
	if len(names) == 0 {
		a.printf("# no rate limit service documents in %s (%s is empty)\n", r, s.layout.RLS(r))
		return nil
	}
	for _, n := range names {
		data := stored.Docs[n]
		a.printf("# %s (ModifyIndex %d), version %s\n", s.layout.RLSDoc(r, n), stored.Index[n], rlsVersion(data))
		a.printf("%s", data)
		if !strings.HasSuffix(string(data), "\n") {
			a.printf("\n")
		}
	}
	return nil
}

// rlsWrite are the flags of every rls command that writes.
type rlsWrite struct {
	merge, dryRun, yes bool
	meta               *meta
}

func (a *app) rlsWriteFlags(fs *flag.FlagSet) *rlsWrite {
	w := &rlsWrite{}
	fs.BoolVar(&w.merge, "merge-domains", false, "documents of one domain are merged, as the edges' --rls-merge-domains does (else refused)")
	w.meta = a.metaFlags(fs)
	fs.BoolVar(&w.dryRun, "dry-run", false, "show what would change and write nothing")
	fs.BoolVar(&w.yes, "yes", false, "do not ask for confirmation on a terminal")
	a.forceFlag(fs, &w.yes)
	return w
}

// regionOrAll checks that cmd got exactly one of --region R and --all.
func regionOrAll(cmd, r string, all bool) error {
	switch {
	case all && r != "":
		return usagef("--all and --region exclude each other")
	case !all && r == "":
		return usagef("%s needs --region R (or --all for every region)", cmd)
	}
	return nil
}
