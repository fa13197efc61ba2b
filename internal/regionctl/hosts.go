package regionctl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// hostProblems lists a host table's problems, each naming file (if any).
func hostProblems(file string, err error) []problem {
	probs := hosts.Problems(err)
	if len(probs) == 0 {
		return []problem{{File: file, Message: err.Error()}}
	}
	out := make([]problem, len(probs))
	for i, p := range probs {
		out[i] = problem{File: file, Line: p.Line, Field: p.Path, Message: p.Msg}
	}
	return out
}

// readHostsFile reads and parses a host table file; an invalid one is
// reported (every problem as FILE:LINE) and exits with ExitInvalid.
func (a *app) readHostsFile(path, tail string) ([]byte, *hosts.Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading host table: %w", err)
	}
	t, err := hosts.Parse(data)
	if err != nil {
		return nil, nil, a.reportInvalid(path, hostProblems(path, err), tail)
	}
	return data, t, nil
}

// emptyTable is what an absent table means: every host to the default pool.
func emptyTable() *hosts.Table { return &hosts.Table{Schema: hosts.SchemaVersion} }

// storedHosts reads a region's host table (whole, when stored in parts):
// the empty table and version "" when absent; err exits with ExitInvalid
// when it does not parse.
func (s *session) storedHosts(r string) (t *hosts.Table, raw []byte, index uint64, version string, err error) {
	stored, index, err := s.get(r, s.layout.Hosts(r))
	if err != nil {
		return nil, nil, 0, "", err
	}
	if stored == nil {
		return emptyTable(), nil, 0, "", nil
	}
	if raw, err = s.resolve(r, stored); err != nil {
		return nil, nil, 0, "", fmt.Errorf("the host table of %s: %w", r, err)
	}
	t, err = hosts.Parse(raw)
	if err != nil {
		return nil, raw, index, "invalid", &codedError{code: ExitInvalid, err: err}
	}
	return t, raw, index, t.Version(), nil
}

// hosts validate FILE...
func (a *app) hostsValidate(args []string) error {
	fs := a.flags("hosts validate", "FILE...")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("hosts validate takes one or more FILEs")
	}
	results := make([]map[string]any, len(pos))
	codes := make([]int, len(pos))
	for i, f := range pos {
		results[i], codes[i] = a.validateHostsFile(f)
	}
	code := combine(codes)
	if a.json() {
		out := map[string]any{"valid": code == ExitOK, "documents": results}
		if code != ExitOK {
			out["exit_code"], out["reason"] = code, reasonOf(code)
		}
		a.emitJSON(out)
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

// validateHostsFile checks one file: the valid line (and unused pools'
// warnings) on stdout, or the problems on stderr.
func (a *app) validateHostsFile(path string) (map[string]any, int) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := fmt.Sprintf("reading host table: %v", err)
		if !a.json() {
			fmt.Fprintln(a.stderr, "regionctl: "+msg)
		}
		return map[string]any{"valid": false, "document": path, "error": msg, "exit_code": ExitError, "reason": reasonOf(ExitError)}, ExitError
	}
	t, err := hosts.Parse(data)
	if err != nil {
		probs := hostProblems(path, err)
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
	warnings := unusedWarnings(t)
	if !a.json() {
		a.printf("%s: valid, %s, %s, version %s\n", path, plural(len(t.Hosts), "host"), plural(len(t.Pools), "pool"), t.Version())
		for _, w := range warnings {
			a.printf("%s: warning: %s\n", path, w)
		}
	}
	return map[string]any{"valid": true, "document": path, "hosts": len(t.Hosts), "pools": len(t.Pools),
		"version": t.Version(), "warnings": warnings}, ExitOK
}

func unusedWarnings(t *hosts.Table) []string {
	out := []string{}
	for _, name := range t.Unused() {
		out = append(out, fmt.Sprintf("pool %q is defined but no host uses it (an edge still connects to and checks its origins)", name))
	}
	return out
}

// hostsDiff is the difference between two host tables, host by host and
// pool by pool.
type hostsDiff struct {
	HostsAdded   []hostChange `json:"hosts_added"`
	HostsRemoved []hostChange `json:"hosts_removed"`
	HostsChanged []hostChange `json:"hosts_changed"`
	PoolsAdded   []string     `json:"pools_added"`
	PoolsRemoved []string     `json:"pools_removed"`
	PoolsChanged []poolChange `json:"pools_changed"`
}

// hostChange is one host pattern's pool before and after ("" when the
// table does not name it: the default pool).
type hostChange struct {
	Host    string `json:"host"`
	OldPool string `json:"old_pool,omitempty"`
	NewPool string `json:"new_pool,omitempty"`
}

type poolChange struct {
	Pool   string        `json:"pool"`
	Fields []fieldChange `json:"fields"`
}

func (d hostsDiff) empty() bool {
	return len(d.HostsAdded)+len(d.HostsRemoved)+len(d.HostsChanged)+
		len(d.PoolsAdded)+len(d.PoolsRemoved)+len(d.PoolsChanged) == 0
}

// diffHosts compares two parsed (so normalised) tables.
func diffHosts(old, new *hosts.Table) hostsDiff {
	d := hostsDiff{HostsAdded: []hostChange{}, HostsRemoved: []hostChange{}, HostsChanged: []hostChange{},
		PoolsAdded: []string{}, PoolsRemoved: []string{}, PoolsChanged: []poolChange{}}
	for _, h := range slices.Sorted(maps.Keys(new.Hosts)) {
		o, had := old.Hosts[h]
		switch n := new.Hosts[h]; {
		case !had:
			d.HostsAdded = append(d.HostsAdded, hostChange{Host: h, NewPool: n.Pool})
		case o != n:
			d.HostsChanged = append(d.HostsChanged, hostChange{Host: h, OldPool: o.Pool, NewPool: n.Pool})
		}
	}
	for _, h := range slices.Sorted(maps.Keys(old.Hosts)) {
		if _, has := new.Hosts[h]; !has {
			d.HostsRemoved = append(d.HostsRemoved, hostChange{Host: h, OldPool: old.Hosts[h].Pool})
		}
	}
	for _, p := range new.PoolNames() {
		o, had := old.Pools[p]
		if !had {
			d.PoolsAdded = append(d.PoolsAdded, p)
			continue
		}
		if fields := poolFields(o, new.Pools[p]); len(fields) > 0 {
			d.PoolsChanged = append(d.PoolsChanged, poolChange{Pool: p, Fields: fields})
		}
	}
	for _, p := range old.PoolNames() {
		if _, has := new.Pools[p]; !has {
			d.PoolsRemoved = append(d.PoolsRemoved, p)
		}
	}
	return d
}

// poolFields lists the settings that differ between two pools, by their
// document names; "" is a setting left out (the edge's own).
func poolFields(old, new hosts.Pool) []fieldChange {
	flat := func(p hosts.Pool) map[string]string {
		data, _ := json.Marshal(p)
		var m map[string]json.RawMessage
		_ = json.Unmarshal(data, &m)
		out := map[string]string{}
		for k, v := range m {
			if k == "tls" {
				var tls map[string]json.RawMessage
				_ = json.Unmarshal(v, &tls)
				for tk, tv := range tls {
					out["tls."+tk] = shown(tv)
				}
				continue
			}
			out[k] = shown(v)
		}
		return out
	}
	o, n := flat(old), flat(new)
	keys := slices.Sorted(maps.Keys(o))
	for k := range n {
		if _, ok := o[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []fieldChange
	for _, k := range keys {
		if o[k] != n[k] {
			out = append(out, fieldChange{Field: k, Old: o[k], New: n[k]})
		}
	}
	return out
}

// shown is a setting for people: a string without its quotes, a long one
// (a CA bundle) as its size and hash.
func shown(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) != nil {
		return string(v)
	}
	if len(s) > 80 {
		sum := sha256.Sum256([]byte(s))
		return fmt.Sprintf("(%d bytes, sha256 %s)", len(s), hex.EncodeToString(sum[:])[:12])
	}
	return s
}

func poolOrDefault(p string) string {
	if p == "" {
		return hosts.DefaultPool + " pool (not in the table)"
	}
	return p
}

func (d hostsDiff) print(w io.Writer) {
	if n := len(d.HostsAdded) + len(d.HostsRemoved) + len(d.HostsChanged); n > 0 {
		fmt.Fprintf(w, "hosts (%d changed):\n", n)
		for _, h := range d.HostsAdded {
			fmt.Fprintf(w, "  + %s -> %s\n", h.Host, h.NewPool)
		}
		for _, h := range d.HostsChanged {
			fmt.Fprintf(w, "  ~ %s: %s -> %s\n", h.Host, h.OldPool, h.NewPool)
		}
		for _, h := range d.HostsRemoved {
			fmt.Fprintf(w, "  - %s: %s -> %s\n", h.Host, h.OldPool, poolOrDefault(""))
		}
	}
	if n := len(d.PoolsAdded) + len(d.PoolsRemoved) + len(d.PoolsChanged); n > 0 {
		fmt.Fprintf(w, "pools (%d changed):\n", n)
		for _, p := range d.PoolsAdded {
			fmt.Fprintf(w, "  + %s\n", p)
		}
		for _, p := range d.PoolsChanged {
			var parts []string
			for _, f := range p.Fields {
				parts = append(parts, fmt.Sprintf("%s %s -> %s", f.Field, dash(f.Old), dash(f.New)))
			}
			fmt.Fprintf(w, "  ~ %s: %s\n", p.Pool, strings.Join(parts, "; "))
		}
		for _, p := range d.PoolsRemoved {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
}

// errHostsDiffer is what hosts diff returns when the tables differ.
var errHostsDiffer = reported(ExitDiffers, "the host tables differ")

// hosts diff OLD NEW | --region R FILE, with diff(1)'s exit codes.
func (a *app) hostsDiffCoded(args []string) error {
	return diffCoded(a, a.hostsDiff(args), errHostsDiffer)
}

func (a *app) hostsDiff(args []string) error {
	fs := a.flags("hosts diff", "--region R FILE | OLD NEW")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	var oldName, newName string
	var old, next *hosts.Table
	var oldData, newData []byte
	switch {
	case len(pos) == 2 && r == "":
		if oldData, old, err = a.readHostsFile(pos[0], ""); err != nil {
			return err
		}
		oldName, newName = pos[0], pos[1]
	case len(pos) == 2:
		return usagef("hosts diff OLD NEW compares two files and takes no --region")
	case len(pos) == 1 && r != "":
		newName = pos[0]
	default:
		return usagef("hosts diff takes FILE (with --region) or two FILEs")
	}
	if newData, next, err = a.readHostsFile(newName, ""); err != nil {
		return err
	}
	if r != "" {
		s, err := a.connectRegion(r)
		if err != nil {
			return err
		}
		defer s.close()
		var stored []byte
		old, stored, _, _, err = s.storedHosts(r)
		if err != nil {
			if isInvalid(err) {
				return a.reportInvalid(fmt.Sprintf("the stored host table of %s (%s)", r, s.layout.Hosts(r)), hostProblems("", err), "")
			}
			return err
		}
		oldName, oldData = fmt.Sprintf("host table of %s (%s)", r, s.layout.Hosts(r)), stored
	}
	d := diffHosts(old, next)
	vOld, vNew := old.Version(), next.Version()
	if oldData == nil {
		vOld = "" // absent
	}
	if a.json() {
		a.emitJSON(map[string]any{"old": oldName, "new": newName, "identical": d.empty(), "diff": d,
			"version_old": vOld, "version_new": vNew})
	} else if d.empty() {
		note := ""
		if !bytes.Equal(oldData, newData) {
			note = " (the texts differ only in formatting, comments, order or spelling)"
		}
		a.printf("no changes: %s is the same host table as %s%s; version %s\n", newName, oldName, note, vNew)
	} else {
		a.printf("--- %s\n+++ %s\n", oldName, newName)
		d.print(a.stdout)
		a.printf("version: %s -> %s\n", dash(vOld), vNew)
	}
	if d.empty() {
		return nil
	}
	return errHostsDiffer
}

// hosts get --region R
func (a *app) hostsGet(args []string) error {
	fs := a.flags("hosts get", "--region R")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("hosts get takes no arguments, got %q", pos)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	key := s.layout.Hosts(r)
	t, raw, index, version, err := s.storedHosts(r)
	if err != nil {
		if isInvalid(err) {
			return a.reportInvalid(fmt.Sprintf("the stored host table of %s (%s, ModifyIndex %d)", r, key, index), hostProblems("", err),
				"; edges keep the table they run")
		}
		return err
	}
	if a.json() {
		out := map[string]any{"region": r, "key": key, "stored": raw != nil, "modify_index": index}
		if raw != nil {
			out["version"], out["document"], out["hosts"], out["pools"] = version, string(raw), len(t.Hosts), len(t.Pools)
		}
		a.emitJSON(out)
		return nil
	}
	if raw == nil {
		a.printf("# no host table in %s (%s is absent): every host goes to the %s pool\n", r, key, hosts.DefaultPool)
		return nil
	}
	a.printf("# host table of %s (%s, ModifyIndex %d, version %s): %s, %s\n", r, key, index, version,
		plural(len(t.Hosts), "host"), plural(len(t.Pools), "pool"))
	_, _ = a.stdout.Write(raw)
	if !bytes.HasSuffix(raw, []byte("\n")) {
		a.printf("\n")
	}
	return nil
}

// hosts push --region R FILE
func (a *app) hostsPush(args []string) error {
	fs := a.flags("hosts push", "--region R [--message M] [--author A] [--expect-version V] [--dry-run] [--yes] [--keep-history N] [--canary POP --for DURATION] FILE")
	var r string
	regionVar(fs, &r)
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	cf := a.canaryFlags(fs, "the region's host table at that PoP only")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if cf.pop != "" {
		if err := cf.checkRun(sf.prometheus); err != nil {
			return err
		}
	}
	if len(pos) != 1 {
		return usagef("hosts push takes one FILE")
	}
	data, t, err := a.readHostsFile(pos[0], "; nothing was written")
	if err != nil {
		return err
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	return a.pushHosts(s, r, data, t, *m, sf, cf, "pushed "+pos[0])
}

// hosts rollback --region R [--to VERSION]
func (a *app) hostsRollback(args []string) error {
	fs := a.flags("hosts rollback", "--region R [--to VERSION] [--message M] [--author A] [--expect-version V] [--dry-run] [--yes] [--keep-history N]")
	var r, to string
	regionVar(fs, &r)
	fs.StringVar(&to, "to", "", "host table `version` (or history seq) to restore; default: the previous one")
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("hosts rollback takes no arguments, got %q", pos)
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	_, raw, _, _, err := s.storedHosts(r)
	if err != nil && !isInvalid(err) {
		return err
	}
	hist, err := s.history(r, region.KindHosts)
	if err != nil {
		return err
	}
	target := rollbackTarget(hist, s.layout.Hosts(r), to, func(doc string) bool { return raw != nil && region.SameDocument(doc, raw) })
	if target == nil {
		if to != "" {
			return fmt.Errorf("no host table with version %q in the history of %s (see rules history --region %s --kind hosts)", to, r, r)
		}
		return fmt.Errorf("no earlier host table in the history of %s: nothing to roll back to", r)
	}
	data, err := s.resolve(r, []byte(target.Document))
	if err != nil {
		return fmt.Errorf("history entry %s: %w", target.Seq, err)
	}
	t, err := hosts.Parse(data)
	if err != nil {
		return invalidf("history entry %s holds an invalid host table: %s", target.Seq, oneLine(err))
	}
	msg := "rollback to " + t.Version()
	if m.message != "" {
		msg += ": " + m.message
	}
	m.message = msg
	return a.pushHosts(s, r, data, t, *m, sf, nil, fmt.Sprintf("rolled the host table back to %s (pushed %s by %s)",
		target.Seq, target.Time.UTC().Format(time.RFC3339), dash(target.Author)))
}

// pushHosts writes data (table t) as region r's host table: --expect-version
// against the table read, the dry run or the confirmation, then
// check-and-set on the index read, with the history entry in the same
// transaction. With a canary (cf, not nil, names a PoP) the table goes to
// that PoP first and is written only when the canary passes.
func (a *app) pushHosts(s *session, r string, data []byte, t *hosts.Table, m meta, sf *safety, cf *canaryFlags, verb string) error {
	key := s.layout.Hosts(r)
	cur, raw, index, curVersion, err := s.storedHosts(r)
	if err != nil && !isInvalid(err) {
		return err
	}
	if cur == nil { // the stored table is invalid: a push is how it is fixed
		cur = emptyTable()
	}
	d := diffHosts(cur, t)
	version := t.Version()
	unchanged := raw != nil && bytes.Equal(raw, data)
	show := func(w io.Writer) {
		fmt.Fprintf(w, "%s: the host table (%s): version %s -> %s\n", r, key, dash(curVersion), version)
		if curVersion == "invalid" {
			fmt.Fprintf(w, "  the stored table is invalid; edges run the last valid one they read\n")
		}
		if d.empty() {
			fmt.Fprintf(w, "  no host or pool changes (formatting, comments or order only)\n")
		}
		d.print(w)
		for _, warn := range unusedWarnings(t) {
			fmt.Fprintf(w, "  warning: %s\n", warn)
		}
	}
	if sf.expect != "" && sf.expect != curVersion {
		return &codedError{code: ExitConflict, msg: fmt.Sprintf(
			"refusing to push: the host table of %s is version %s, not %s; nothing was written", r, dash(curVersion), sf.expect)}
	}
	if sf.dryRun {
		if a.json() {
			a.emitJSON(map[string]any{"dry_run": true, "region": r, "key": key, "unchanged": unchanged, "diff": d,
				"version_before": curVersion, "version": version, "warnings": unusedWarnings(t),
				"exit_code": ExitOK, "reason": reasonOf(ExitOK)})
			return nil
		}
		show(a.stdout)
		a.printf("dry run: nothing was written\n")
		return nil
	}
	res := pushResult{Region: r, Document: "hosts", Key: key, DocumentVersion: version, Version: version, PreviousVersion: curVersion}
	if unchanged {
		res.Status = "unchanged"
	} else {
		if !sf.yes {
			if err := a.confirm(show, fmt.Sprintf("Push this host table to %s?", r)); err != nil {
				return err
			}
		}
		write := func(res pushResult) pushResult {
			e, err := s.push(r, key, data, index, region.Entry{Kind: region.KindHosts, Version: version,
				Author: m.author, Host: m.host, Message: m.message})
			if err != nil {
				return s.failed(res, err)
			}
			res.Status, res.Seq = "ok", e.Seq
			s.afterPush(&res, m, false, false)
			return res
		}
		if cf != nil && cf.pop != "" {
			switch {
			case raw == nil:
				return usagef("--canary: %s has no host table for PoP %s to return to: push the first table without --canary", r, cf.pop)
			case len(data) > region.InlineMax:
				return invalidf("--canary takes host tables up to %d bytes (one Consul value); this one is %d: push it without --canary", region.InlineMax, len(data))
			}
			return a.runCanary(s, sf.prometheus, cf, candidate{
				kind: region.CanaryHosts, region: r, doc: data,
				what: "host table version", version: version, before: curVersion,
				reported: func(e region.Edge) string { return e.HostsVersion },
				promote: func() ([]pushResult, []string) {
					res := write(res)
					return []pushResult{res}, []string{hostsLine(r, verb, curVersion, res)}
				},
			})
		}
		res = write(res)
	}
	if a.json() {
		a.emitJSON(map[string]any{"results": []pushResult{res}, "diff": d, "warnings": unusedWarnings(t),
			"exit_code": res.ExitCode, "reason": reasonOf(res.ExitCode)})
	}
	if res.ExitCode != ExitOK {
		return &codedError{code: res.ExitCode, msg: res.Error}
	}
	if a.json() {
		return nil
	}
	if res.Status != "ok" {
		a.printf("%s: unchanged: the host table already is version %s\n", r, version)
		return nil
	}
	a.printf("%s\n", hostsLine(r, verb, curVersion, res))
	d.print(a.stdout)
	for _, w := range unusedWarnings(t) {
		a.printf("warning: %s\n", w)
	}
	return nil
}

// hostsLine is a host table push's line for res (ok).
func hostsLine(r, verb, curVersion string, res pushResult) string {
	line := fmt.Sprintf("%s: ok: %s: version %s -> %s (history %s)", r, verb, dash(curVersion), res.DocumentVersion, res.Seq)
	if res.HistoryPruned > 0 {
		line += "; pruned " + entries(res.HistoryPruned, "history ")
	}
	if res.Warning != "" {
		line += "; warning: " + res.Warning
	}
	return line
}
