package regionctl

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// safety are a push's guards: --expect-version (check-and-set on the
// version the operator reviewed), --dry-run (show, write nothing), the
// confirmation on a terminal (--yes skips it), and --prometheus, where a
// dry run or a confirmation finds the affected rules' traffic.
type safety struct {
	dryRun, yes bool
	expect      string
	prometheus  string
	allowEmpty  bool // rules push and rollback: a push may leave a region no rule
}

// allowEmptyFlag is --allow-empty, for the pushes of rules documents.
func (sf *safety) allowEmptyFlag(fs *flag.FlagSet) {
	fs.BoolVar(&sf.allowEmpty, "allow-empty", false, "push even though the region's effective rules would hold no rule: the one way to clear every rule (an absent document never does: edges keep their rules)")
}

func (a *app) safetyFlags(fs *flag.FlagSet) *safety {
	sf := &safety{}
	fs.BoolVar(&sf.dryRun, "dry-run", false, "show what would change (rules, versions, the affected rules' traffic) and write nothing")
	fs.BoolVar(&sf.yes, "yes", false, "do not ask for confirmation on a terminal")
	a.forceFlag(fs, &sf.yes)
	fs.StringVar(&sf.expect, "expect-version", "", "refuse (exit 3) unless the document in force is `version` V (its document version, as rules history shows it, or the effective version, as rules get and rules diff show it)")
	fs.StringVar(&sf.prometheus, "prometheus", a.env("PROMETHEUS_URL"), "Prometheus `URL` scraping the edges: --dry-run and the confirmation show the current traffic (of the affected rules; of the whole region for a switch) (default $PROMETHEUS_URL; none: no traffic shown)")
	return sf
}

// guard applies --expect-version to every plan, then either shows the dry
// run or asks for confirmation. An error means nothing may be written.
func (a *app) guard(s *session, plans []plan, sf *safety, what string) error {
	if sf == nil {
		return nil
	}
	if sf.expect != "" {
		var stale []string
		for _, p := range plans {
			if p.err == nil && sf.expect != p.curVersion && sf.expect != p.before {
				stale = append(stale, fmt.Sprintf("%s: the %s is document version %s (effective rules version %s), not %s",
					p.d.region, p.d.what(), dash(p.curVersion), dash(p.before), sf.expect))
			}
		}
		if len(stale) > 0 {
			head := fmt.Sprintf("refusing to push %s: the document in force changed since version %s was reviewed; nothing was written", what, sf.expect)
			if a.json() {
				a.emitJSON(map[string]any{"file": what, "status": "conflict", "error": head, "stale": stale,
					"exit_code": ExitConflict, "reason": reasonOf(ExitConflict)})
			}
			fmt.Fprintln(a.stderr, "regionctl: "+head+":")
			for _, l := range stale {
				fmt.Fprintln(a.stderr, "  "+l)
			}
			return reported(ExitConflict, head)
		}
	}
	changes := a.changesOf(s, plans, sf.prometheus)
	if sf.dryRun {
		if a.json() {
			a.emitJSON(map[string]any{"file": what, "dry_run": true, "changes": changes, "exit_code": ExitOK, "reason": reasonOf(ExitOK)})
			return nil
		}
		for _, c := range changes {
			c.print(a.stdout)
		}
		a.printf("dry run: nothing was written\n")
		return nil
	}
	if sf.yes {
		return nil
	}
	return a.confirm(func(w io.Writer) {
		for _, c := range changes {
			c.print(w)
		}
	}, fmt.Sprintf("Push %s to %s?", what, plural(len(plans), "region")))
}

// change is what a push would do to one region.
type change struct {
	Region                 string                        `json:"region"`
	Document               string                        `json:"document"`
	Key                    string                        `json:"key"`
	Unchanged              bool                          `json:"unchanged"`
	DocumentVersionBefore  string                        `json:"document_version_before"`
	DocumentVersion        string                        `json:"document_version"`
	EffectiveVersionBefore string                        `json:"effective_version_before"`
	EffectiveVersion       string                        `json:"effective_version"`
	Added                  []string                      `json:"added"`
	Removed                []string                      `json:"removed"`
	Changed                []changedRule                 `json:"changed"`
	Traffic                map[string]map[string]float64 `json:"traffic,omitempty"` // rule → decision → requests/s over the last 5 minutes
	TrafficNote            string                        `json:"traffic_note,omitempty"`
}

func (a *app) changesOf(s *session, plans []plan, promURL string) []change {
	out := make([]change, 0, len(plans))
	for _, p := range plans {
		c := change{Region: p.d.region, Document: docName(p.d), Key: p.key, Unchanged: p.unchanged,
			DocumentVersionBefore: p.curVersion, DocumentVersion: p.docVersion,
			EffectiveVersionBefore: p.before, EffectiveVersion: p.after}
		old, errOld := a.parseStoredOnce(p.cur)
		doc, errNew := a.parseRules(p.data)
		if errOld == nil && errNew == nil {
			d := diffRules(old, doc)
			c.Added, c.Removed, c.Changed = d.Added, d.Removed, d.Changed
		}
		affected := slices.Concat(c.Added, c.Removed)
		for _, ch := range c.Changed {
			affected = append(affected, ch.ID)
		}
		switch {
		case len(affected) == 0:
		case promURL == "":
			c.TrafficNote = "no --prometheus (or $PROMETHEUS_URL): traffic not shown"
		default:
			ctx, cancel := context.WithTimeout(context.Background(), a.g.timeout)
			traffic, err := ruleTraffic(ctx, promURL, p.d.region, affected)
			cancel()
			if err != nil {
				c.TrafficNote = "traffic unavailable: " + oneLine(err)
			} else {
				c.Traffic = traffic
				c.TrafficNote = "requests/s per decision over the last 5m; a rule without metrics: true has no series of its own"
			}
		}
		out = append(out, c)
	}
	return out
}

func (c change) print(w io.Writer) {
	if c.Unchanged {
		fmt.Fprintf(w, "%s: unchanged: the %s document already holds it (document version %s)\n", c.Region, c.Document, c.DocumentVersion)
		return
	}
	fmt.Fprintf(w, "%s: the %s document (%s): document version %s -> %s; effective rules version %s -> %s\n",
		c.Region, c.Document, c.Key, dash(c.DocumentVersionBefore), c.DocumentVersion, dash(c.EffectiveVersionBefore), c.EffectiveVersion)
	ruleDiff{Added: c.Added, Removed: c.Removed, Changed: c.Changed}.print(indent{w})
	if c.TrafficNote == "" {
		return
	}
	fmt.Fprintf(w, "  traffic (%s):\n", c.TrafficNote)
	ids := slices.Concat(c.Added, c.Removed)
	for _, ch := range c.Changed {
		ids = append(ids, ch.ID)
	}
	slices.Sort(ids)
	for _, id := range ids {
		t, ok := c.Traffic[id]
		if !ok {
			if c.Traffic != nil {
				fmt.Fprintf(w, "    %s: no series\n", id)
			}
			continue
		}
		var parts []string
		for _, dec := range slices.Sorted(maps.Keys(t)) {
			parts = append(parts, fmt.Sprintf("%s %.3g/s", dec, t[dec]))
		}
		fmt.Fprintf(w, "    %s: %s\n", id, strings.Join(parts, ", "))
	}
}

// indent writes every line two spaces in.
type indent struct{ w io.Writer }

func (i indent) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		if _, err := io.WriteString(i.w, "  "+line); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// ruleTraffic asks Prometheus for the decisions of rules ids in region over
// the last 5 minutes, in requests per second by decision.
func ruleTraffic(ctx context.Context, promURL, region string, ids []string) (map[string]map[string]float64, error) {
	quoted := make([]string, len(ids))
	for i, id := range ids {
		quoted[i] = regexp.QuoteMeta(id)
	}
	return decisionRates(ctx, promURL, fmt.Sprintf(`sum by (rule, decision) (rate(edgeguard_edge_decisions_total{region=%q, rule=~%q}[5m]))`,
		region, strings.Join(quoted, "|")))
}

// decisionRates runs an instant query whose series carry rule and decision
// labels (rule may be absent) and returns rule → decision → value.
func decisionRates(ctx context.Context, promURL, q string) (map[string]map[string]float64, error) {
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		return nil, fmt.Errorf("prometheus client: %w", err)
	}
	v, _, _, err := promv1.NewAPI(c).Query(ctx, q, time.Now())
	if err != nil {
		return nil, fmt.Errorf("querying prometheus (%s): %w", q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("querying prometheus (%s): unexpected %s result", q, v.Type())
	}
	out := map[string]map[string]float64{}
	for _, s := range vec {
		rule, dec := string(s.Metric["rule"]), string(s.Metric["decision"])
		if out[rule] == nil {
			out[rule] = map[string]float64{}
		}
		out[rule][dec] = float64(s.Value)
	}
	return out, nil
}

// confirm asks on a terminal before a write: it shows what would change
// and reads y or yes from stdin. Without a terminal (scripts, CI) or with
// --yes it does not ask.
func (a *app) confirm(show func(io.Writer), question string) error {
	if a.isTerminal == nil || !a.isTerminal() {
		return nil
	}
	show(a.stderr)
	fmt.Fprintf(a.stderr, "%s Only yes or y goes ahead (--yes skips this question): ", question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && line == "" {
		return &codedError{code: ExitError, msg: "no answer: nothing was written"}
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &codedError{code: ExitError, msg: "not confirmed: nothing was written"}
}
