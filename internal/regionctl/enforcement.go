package regionctl

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/region"
)

func init() {
	commands["enforcement get"] = (*app).enforcementGet
	commands["enforcement set"] = (*app).enforcementSet
	commands["enforcement rollback"] = (*app).enforcementRollback
}

// storedEnforcement reads a region's switch: the default when absent;
// version "invalid" when it does not parse.
func (s *session) storedEnforcement(r string) (en region.Enforcement, raw []byte, index uint64, version string, err error) {
	raw, index, err = s.get(r, s.layout.Enforcement(r))
	if err != nil {
		return en, nil, 0, "", err
	}
	en, perr := region.ParseEnforcement(raw)
	if perr != nil {
		return en, raw, index, "invalid", nil
	}
	return en, raw, index, en.Version(), nil
}

// enforcement get --region R
func (a *app) enforcementGet(args []string) error {
	fs := a.flags("enforcement get", "--region R")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("enforcement get takes no arguments, got %q", pos)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	en, raw, index, version, err := s.storedEnforcement(r)
	if err != nil {
		return err
	}
	key := s.layout.Enforcement(r)
	if version == "invalid" {
		_, perr := region.ParseEnforcement(raw)
		return invalidf("the stored enforcement switch of %s (%s) is invalid (edges keep the switch they run): %s", r, key, oneLine(perr))
	}
	stored := len(bytes.TrimSpace(raw)) > 0
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "key": key, "stored": stored, "modify_index": index,
			"mode": en.Mode, "percent": en.Percent, "version": version})
		return nil
	}
	where := fmt.Sprintf("%s, ModifyIndex %d", key, index)
	if !stored {
		where = key + " is absent: the default"
	}
	a.printf("%s: %s (version %s; %s)\n", r, en, version, where)
	return nil
}

// enforcement set --region R MODE [--percent P]
func (a *app) enforcementSet(args []string) error {
	fs := a.flags("enforcement set", "--region R (shadow | enforce [--percent P]) [--message M] [--author A] [--expect-version V] [--dry-run] [--yes]\n\n"+
		"shadow: every rule of the region counts and denies nothing. enforce: rules deny, for all keys or,\n"+
		"with --percent P, for P % of each rule's keys (chosen by a stable hash of the key, the same on every edge).")
	var r string
	var percent float64
	regionVar(fs, &r)
	fs.Float64Var(&percent, "percent", 100, "with enforce: the `share` of keys enforced, 0 to 100 in steps of 0.01")
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	percentSet := false
	fs.Visit(func(f *flag.Flag) { percentSet = percentSet || f.Name == "percent" })
	if len(pos) != 1 {
		return usagef("enforcement set takes one mode: shadow or enforce")
	}
	en := region.Enforcement{Mode: pos[0], Percent: percent}
	if en.Mode == region.ModeShadow && percentSet {
		return usagef("--percent goes with enforce (shadow enforces no key)")
	}
	if err := en.Validate(); err != nil {
		return usagef("enforcement set: %s", oneLine(err))
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	return a.pushEnforcement(s, r, en, *m, sf, "set the enforcement switch")
}

// enforcement rollback --region R [--to VERSION]
func (a *app) enforcementRollback(args []string) error {
	fs := a.flags("enforcement rollback", "--region R [--to VERSION] [--message M] [--author A] [--expect-version V] [--dry-run] [--yes]")
	var r, to string
	regionVar(fs, &r)
	fs.StringVar(&to, "to", "", "switch `version` (or history seq) to restore; default: the previous one")
	m := a.metaFlags(fs)
	sf := a.safetyFlags(fs)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("enforcement rollback takes no arguments, got %q", pos)
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	_, raw, _, _, err := s.storedEnforcement(r)
	if err != nil {
		return err
	}
	hist, err := s.history(r, region.KindEnforcement)
	if err != nil {
		return err
	}
	key := s.layout.Enforcement(r)
	target := rollbackTarget(hist, key, to, func(doc string) bool { return doc == string(raw) })
	if target == nil {
		if to != "" {
			return fmt.Errorf("no enforcement switch with version %q in the history of %s (see rules history --region %s --kind enforcement)", to, r, r)
		}
		return fmt.Errorf("no earlier enforcement switch in the history of %s: nothing to roll back to", r)
	}
	en, err := region.ParseEnforcement([]byte(target.Document))
	if err != nil {
		return invalidf("history entry %s holds an invalid switch: %s", target.Seq, oneLine(err))
	}
	msg := "rollback to " + en.Version()
	if m.message != "" {
		msg += ": " + m.message
	}
	m.message = msg
	return a.pushEnforcement(s, r, en, *m, sf, fmt.Sprintf("rolled the enforcement switch back to %s (pushed %s by %s)",
		target.Seq, target.Time.UTC().Format(time.RFC3339), dash(target.Author)))
}

// switchChange is what a switch push would do.
type switchChange struct {
	Region        string `json:"region"`
	Key           string `json:"key"`
	Before        string `json:"before"`
	After         string `json:"after"`
	VersionBefore string `json:"version_before"`
	Version       string `json:"version"`
	Unchanged     bool   `json:"unchanged"`
	// Traffic is the region's decisions now, requests/s by decision over
	// the last 5 minutes (--prometheus): what the switch would act on.
	Traffic     map[string]float64 `json:"traffic,omitempty"`
	TrafficNote string             `json:"traffic_note,omitempty"`
}

func (c switchChange) print(w io.Writer) {
	if c.Unchanged {
		fmt.Fprintf(w, "%s: unchanged: the enforcement switch already is %s (version %s)\n", c.Region, c.After, c.Version)
		return
	}
	fmt.Fprintf(w, "%s: the enforcement switch (%s): %s -> %s; version %s -> %s\n", c.Region, c.Key, c.Before, c.After, c.VersionBefore, c.Version)
	switch {
	case c.Traffic != nil:
		var parts []string
		for _, dec := range slices.Sorted(maps.Keys(c.Traffic)) {
			parts = append(parts, fmt.Sprintf("%s %.3g/s", dec, c.Traffic[dec]))
		}
		if len(parts) == 0 {
			parts = []string{"no decisions"}
		}
		fmt.Fprintf(w, "  traffic of %s (%s): %s\n", c.Region, c.TrafficNote, strings.Join(parts, ", "))
	case c.TrafficNote != "":
		fmt.Fprintf(w, "  traffic: %s\n", c.TrafficNote)
	}
}

// pushEnforcement writes en as region r's switch: --expect-version against
// the switch read, the dry run or the confirmation, then check-and-set on
// the index read, with the history entry in the same transaction.
func (a *app) pushEnforcement(s *session, r string, en region.Enforcement, m meta, sf *safety, verb string) error {
	cur, raw, index, curVersion, err := s.storedEnforcement(r)
	if err != nil {
		return err
	}
	before := cur.String()
	if curVersion == "invalid" {
		before = "invalid"
	}
	data := en.Marshal()
	c := switchChange{Region: r, Key: s.layout.Enforcement(r), Before: before, After: en.String(),
		VersionBefore: curVersion, Version: en.Version(), Unchanged: bytes.Equal(raw, data)}
	if !c.Unchanged && (sf.dryRun || !sf.yes && a.isTerminal != nil && a.isTerminal()) {
		if sf.prometheus == "" {
			c.TrafficNote = "no --prometheus (or $PROMETHEUS_URL): traffic not shown"
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), a.g.timeout)
			rates, err := decisionRates(ctx, sf.prometheus, fmt.Sprintf(`sum by (decision) (rate(edgeguard_edge_decisions_total{region=%q}[5m]))`, r))
			cancel()
			if err != nil {
				c.TrafficNote = "traffic unavailable: " + oneLine(err)
			} else {
				c.Traffic, c.TrafficNote = map[string]float64{}, "requests/s per decision over the last 5m, every rule"
				maps.Copy(c.Traffic, rates[""])
			}
		}
	}
	if sf.expect != "" && sf.expect != curVersion {
		return &codedError{code: ExitConflict, msg: fmt.Sprintf(
			"refusing to push: the enforcement switch of %s is version %s (%s), not %s; nothing was written", r, curVersion, before, sf.expect)}
	}
	if sf.dryRun {
		if a.json() {
			a.emitJSON(map[string]any{"dry_run": true, "changes": []switchChange{c}, "exit_code": ExitOK, "reason": reasonOf(ExitOK)})
			return nil
		}
		c.print(a.stdout)
		a.printf("dry run: nothing was written\n")
		return nil
	}
	res := pushResult{Region: r, Document: "enforcement", Key: c.Key, DocumentVersion: c.Version,
		Version: c.Version, PreviousVersion: curVersion}
	if c.Unchanged {
		res.Status = "unchanged"
	} else {
		if !sf.yes {
			if err := a.confirm(c.print, fmt.Sprintf("Set the enforcement switch of %s to %s?", r, en)); err != nil {
				return err
			}
		}
		e, err := s.push(r, c.Key, data, index, region.Entry{Kind: region.KindEnforcement, Version: c.Version,
			Author: m.author, Host: m.host, Message: m.message})
		if err != nil {
			res = s.failed(res, err)
		} else {
			res.Status, res.Seq = "ok", e.Seq
			s.afterPush(&res, m, false, false)
		}
	}
	if a.json() {
		a.emitJSON(map[string]any{"results": []pushResult{res}, "exit_code": res.ExitCode, "reason": reasonOf(res.ExitCode)})
	}
	switch res.Status {
	case "ok":
		if !a.json() {
			a.printf("%s: ok: %s: %s -> %s (version %s, history %s)\n", r, verb, before, en, c.Version, res.Seq)
		}
	case "unchanged":
		if !a.json() {
			c.print(a.stdout)
		}
	default:
		return &codedError{code: res.ExitCode, msg: res.Error}
	}
	return nil
}
