package regionctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// ExitRolledBack is a canary push judged bad and rolled back: the region
// kept its document.
const ExitRolledBack = 11

// canaryFlags are --canary's (rules push, shedder set): the PoP, how long
// it runs the candidate, and the thresholds it is judged by.
type canaryFlags struct {
	pop         string
	region      string // rules push --all: the region part of --canary REGION/POP
	dur         time.Duration
	loadTimeout time.Duration
	maxRatio    float64 // the canary's rate may be this many times the rest's...
	slack       float64 // ...plus this fraction of its requests
	minRequests float64 // fewer requests at the canary PoP: no verdict, rolled back
}

// canaryFlags registers them; doc names what the canary replaces at the
// PoP, for --canary's help.
func (a *app) canaryFlags(fs *flag.FlagSet, doc string) *canaryFlags {
	c := &canaryFlags{}
	fs.StringVar(&c.pop, "canary", "", "push to the edges of `POP` first ("+doc+"), judge them against the rest of the region on Prometheus (--prometheus), then promote or roll back by itself")
	fs.DurationVar(&c.dur, "for", 5*time.Minute, "with --canary: how long the PoP runs the candidate before it is judged (cover several scrape intervals)")
	fs.DurationVar(&c.loadTimeout, "canary-load-timeout", time.Minute, "with --canary: how long the PoP's edges may take to report the candidate's version; later, the canary is rolled back")
	fs.Float64Var(&c.maxRatio, "canary-max-ratio", 2, "with --canary: the PoP's deny, 5xx, shed and fallback rates may each be at most this many times the rest of the region's, plus --canary-slack")
	fs.Float64Var(&c.slack, "canary-slack", 0.02, "with --canary: the absolute slack added to each bound of --canary-max-ratio, a fraction of the PoP's requests (0.02: 2 percentage points)")
	fs.Float64Var(&c.minRequests, "canary-min-requests", 100, "with --canary: fewer requests at the PoP over the judged window give no verdict, and the canary is rolled back")
	return c
}

// popName is what a PoP's name may hold: it becomes a Consul key's last
// segment. regionName is what --all --canary's region part may hold: a
// key segment too, before it is checked against the known regions.
var (
	popName    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	regionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
)

// check checks rules push's --canary: POP with --region (the region
// document, or with --global the region's copy of the global one), and
// REGION/POP with --all, whose canary runs in one region before the
// document goes to every region.
func (c *canaryFlags) check(all bool, prometheus string) error {
	if all {
		r, pop, ok := strings.Cut(c.pop, "/")
		switch {
		case !ok || r == "":
			return usagef("--all --canary takes REGION/POP (the PoP of one region that runs the global document first), got %q", c.pop)
		case !regionName.MatchString(r):
			return usagef("--canary %q: %q is not a region name (letters, digits, '.', '_', '-')", c.pop, r)
		}
		c.region, c.pop = r, pop
	}
	return c.checkRun(prometheus)
}

// checkRun checks the flags every kind of canary shares.
func (c *canaryFlags) checkRun(prometheus string) error {
	switch {
	case !popName.MatchString(c.pop):
		return usagef("--canary: %q is not a PoP name (letters, digits, '.', '_', '-')", c.pop)
	case c.dur <= 0:
		return usagef("--for must be > 0, got %s", c.dur)
	case c.loadTimeout <= 0:
		return usagef("--canary-load-timeout must be > 0, got %s", c.loadTimeout)
	case !(c.maxRatio >= 1) || math.IsInf(c.maxRatio, 0):
		return usagef("--canary-max-ratio must be a finite number >= 1, got %v", c.maxRatio)
	case !(c.slack >= 0 && c.slack <= 1):
		return usagef("--canary-slack must be between 0 and 1, got %v", c.slack)
	case !(c.minRequests >= 0) || math.IsInf(c.minRequests, 0):
		return usagef("--canary-min-requests must be >= 0, got %v", c.minRequests)
	case prometheus == "":
		return usagef("--canary needs --prometheus URL (or $PROMETHEUS_URL): the canary is judged on the edges' metrics")
	}
	return nil
}

// figures are one side's rates over the judged window: the fractions of
// its requests denied, answered 5xx (by the origin, or by the edge for an
// origin it could not reach), shed, and of its rule
// decisions taken by the fallback; refused counts documents refused.
type figures struct {
	Requests float64 `json:"requests"`
	Deny     float64 `json:"deny_rate"`
	Err5xx   float64 `json:"5xx_rate"`
	Shed     float64 `json:"shed_rate"`
	Fallback float64 `json:"fallback_rate"`
	Refused  float64 `json:"refused_documents"`
}

// verdict is the canary's judgement.
type verdict struct {
	Promote bool     `json:"promote"`
	Reasons []string `json:"reasons,omitempty"` // why not
	Canary  figures  `json:"canary"`
	Rest    figures  `json:"rest"`
}

// judge compares the canary PoP with the rest of the region: any refused
// document, too little traffic, or a rate above maxRatio × the rest's +
// slack fails it.
func (c *canaryFlags) judge(canary, rest figures) verdict {
	v := verdict{Canary: canary, Rest: rest}
	if canary.Refused > 0 {
		v.Reasons = append(v.Reasons, fmt.Sprintf("the PoP refused %g document(s)", canary.Refused))
	}
	if canary.Requests < c.minRequests {
		v.Reasons = append(v.Reasons, fmt.Sprintf("the PoP served %.0f requests, under --canary-min-requests %g: no verdict", canary.Requests, c.minRequests))
	}
	for _, r := range []struct {
		name       string
		can, other float64
	}{
		{"deny", canary.Deny, rest.Deny},
		{"5xx", canary.Err5xx, rest.Err5xx},
		{"shed", canary.Shed, rest.Shed},
		{"fallback", canary.Fallback, rest.Fallback},
	} {
		if bound := c.maxRatio*r.other + c.slack; r.can > bound || math.IsNaN(r.can) {
			v.Reasons = append(v.Reasons, fmt.Sprintf("%s rate %.4f over %.4f (%g × the rest's %.4f + %g)", r.name, r.can, bound, c.maxRatio, r.other, c.slack))
		}
	}
	v.Promote = len(v.Reasons) == 0
	return v
}

// canaryPush plans the push of the region document (or, with --global,
// of the region's copy of the global one) behind a canary, applies the
// push's own checks (a valid, non-empty result; --expect-version; the dry
// run or the confirmation), then runs the canary.
func (a *app) canaryPush(s *session, d docFlags, data []byte, m meta, sf *safety, cf *canaryFlags, file string) error {
	p := s.plan(d, data, a.versionOf(data))
	if p.err != nil {
		res := s.write(p, m) // refuses: p.err is set
		return &codedError{code: res.ExitCode, msg: fmt.Sprintf("refusing to push %s: %s", file, res.Error)}
	}
	plans := []plan{p}
	if err := a.refuseEmpty(plans, sf, file); err != nil {
		return err
	}
	if err := a.guard(s, plans, sf, file); err != nil || sf.dryRun {
		return err
	}
	return a.rulesCanary(s, p, m, sf, cf, file)
}

// rulesCanary runs the canary of plan p (read and checked) at PoP cf.pop:
// promoted, p is written region-wide with history.
func (a *app) rulesCanary(s *session, p plan, m meta, sf *safety, cf *canaryFlags, file string) error {
	if p.unchanged {
		a.printf("%s: unchanged: the %s document already holds %s; no canary\n", p.d.region, docName(p.d), file)
		return nil
	}
	if len(p.data) > region.InlineMax {
		return invalidf("--canary takes documents up to %d bytes (one Consul value); %s is %d: push it without --canary", region.InlineMax, file, len(p.data))
	}
	c := rulesCandidate(p)
	c.promote = func() ([]pushResult, []string) {
		res := s.write(p, m)
		return []pushResult{res}, []string{res.line("wrote " + file)}
	}
	return a.runCanary(s, sf.prometheus, cf, c)
}

// rulesCandidate is the canary of a rules plan: the region document, or
// the global one (read by the PoP in place of rules/global, under the
// region document). Either way the PoP's edges report the effective rules
// version the plan computed (p.after).
func rulesCandidate(p plan) candidate {
	kind := region.CanaryRules
	if p.d.global {
		kind = region.CanaryGlobal
	}
	return candidate{
		kind: kind, region: p.d.region, doc: p.data,
		what: "rules version", version: p.after, before: p.before,
		reported: func(e region.Edge) string { return e.RulesVersion },
	}
}

// allCanaryPush is rules push --all --canary REGION/POP: every region's
// plan is read and checked first, as --all does (anything invalid
// anywhere refuses the push), then the canary runs at POP of REGION; once
// promoted, the document is written to every region one by one (the
// canary's region first), as --all writes it. Rolled back, nothing is
// written anywhere.
func (a *app) allCanaryPush(s *session, targets []docFlags, data []byte, m meta, sf *safety, cf *canaryFlags, file string) error {
	plans, done, err := a.planAll(s, targets, data, a.versionOf(data), m, sf, file)
	if err != nil || done {
		return err
	}
	// A region that cannot be read now would fail the promotion after the
	// canary passed: refuse before anything is written.
	var unread []string
	var codes []int
	for _, p := range plans {
		if p.err != nil {
			unread, codes = append(unread, p.d.region+": "+a.message(p.err)), append(codes, exitCode(p.err))
		}
	}
	if len(unread) > 0 {
		return &codedError{code: combine(codes), msg: fmt.Sprintf("refusing to push %s behind a canary: %s; nothing was written", file, strings.Join(unread, "; "))}
	}
	i := slices.IndexFunc(plans, func(p plan) bool { return p.d.region == cf.region })
	if i < 0 {
		return usagef("--canary %s/%s: %s is not among the regions --all writes", cf.region, cf.pop, cf.region)
	}
	// The canary's region first: it is the one the verdict is about.
	plans = append([]plan{plans[i]}, append(plans[:i:i], plans[i+1:]...)...)
	p := plans[0]
	if p.unchanged {
		return usagef("--canary %s/%s: the global document of %s already holds %s, so its PoP would run nothing new: pick a region that does not hold it yet, or push without --canary", cf.region, cf.pop, cf.region, file)
	}
	if len(p.data) > region.InlineMax {
		return invalidf("--canary takes documents up to %d bytes (one Consul value); %s is %d: push it without --canary", region.InlineMax, file, len(p.data))
	}
	c := rulesCandidate(p)
	c.keeps = "no region was written"
	c.promote = func() ([]pushResult, []string) {
		if !a.json() {
			names := make([]string, len(plans))
			for i, p := range plans {
				names[i] = p.d.region
			}
			a.printf("Pushing %s as the global document to %s (%s).\n%s\n", file, plural(len(plans), "region"), strings.Join(names, ", "), oneByOne)
		}
		results, lines := make([]pushResult, 0, len(plans)), make([]string, 0, len(plans))
		for _, p := range plans {
			res := s.write(p, m)
			results, lines = append(results, res), append(lines, res.line("wrote "+file))
		}
		return results, lines
	}
	return a.runCanary(s, sf.prometheus, cf, c)
}

// candidate is a document a canary tries out, whatever its kind.
type candidate struct {
	kind   region.CanaryKind
	region string
	doc    []byte // what the canary key holds
	// what names the version the edges report, version is the
	// candidate's (what the PoP's edges report once they run it) and
	// before the region's (kept on a roll back).
	what, version, before string
	// keeps says what a roll back leaves ("" the region keeps before).
	keeps    string
	reported func(region.Edge) string
	// promote writes the candidate as the kind's normal push does
	// (check-and-set, history): each region's result and its line, the
	// canary's region first.
	promote func() ([]pushResult, []string)
}

// runCanary runs a canary of c at PoP cf.pop: writes the kind's canary
// key, waits for the PoP's edges to report the candidate, lets it run for
// --for, judges it on Prometheus, then promotes it (c.promote) or rolls
// it back (the canary key deleted). The canary key never outlives the
// command silently: an error or a signal deletes it, and says how to when
// that fails.
func (a *app) runCanary(s *session, prometheus string, cf *canaryFlags, c candidate) (err error) {
	r := c.region
	log := slog.New(slog.NewTextHandler(a.stderr, nil))
	edges, err := s.edges(r)
	if err != nil {
		return err
	}
	inRegion, inPoP := region.Count(edges, r, cf.pop)
	switch {
	case inPoP == 0:
		return usagef("--canary %s: no healthy edge of %s is in PoP %s (see regions status --region %s)", cf.pop, r, cf.pop, r)
	case inRegion == inPoP:
		return usagef("--canary %s: every healthy edge of %s is in PoP %s: nothing to compare it with", cf.pop, r, cf.pop)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	key := s.layout.Canary(c.kind, r, cf.pop)
	wctx, cancel := s.ctx()
	err = s.c.StartCanary(wctx, c.kind, r, cf.pop, c.doc)
	cancel()
	if errors.Is(err, region.ErrCanaryRunning) {
		var under []string
		for _, k := range region.CanaryKinds {
			under = append(under, s.layout.Canaries(k, r))
		}
		return &codedError{code: ExitConflict, err: err, msg: fmt.Sprintf(
			"a canary is already running in %s (a key under %s): wait for it, or delete it if its regionctl is gone; nothing was written",
			r, strings.Join(under, " or "))}
	}
	if err != nil {
		return need(err, "key write on "+key+" in "+r)
	}
	promoted := false
	defer func() {
		if promoted {
			return
		}
		// A fresh context: the command's may be cancelled already.
		dctx, cancel := s.ctx()
		derr := s.c.StopCanary(dctx, c.kind, r, cf.pop)
		cancel()
		if derr != nil {
			fmt.Fprintf(a.stderr, "regionctl: CANARY KEY LEFT BEHIND: could not delete %s in %s (%s); PoP %s runs the candidate until it is deleted: consul kv delete -datacenter=%s %s\n",
				key, r, a.message(derr), cf.pop, r, key)
			log.Error("canary key left behind", "region", r, "pop", cf.pop, "key", key, "err", a.message(derr))
			return
		}
		log.Info("canary key deleted", "region", r, "pop", cf.pop, "key", key)
	}()
	log.Info("canary started", "region", r, "pop", cf.pop, "kind", string(c.kind), "key", key, "version", c.version, "edges_in_pop", inPoP, "edges_in_region", inRegion)
	a.progress("%s: canary: wrote %s; waiting for the %s of PoP %s to report %s %s\n", r, key, plural(inPoP, "healthy edge"), cf.pop, c.what, c.version)

	rolledBack := func(v *verdict, why string) error {
		log.Warn("canary verdict", "region", r, "pop", cf.pop, "kind", string(c.kind), "verdict", "rolled back", "reason", why)
		if !a.json() {
			keeps := c.keeps
			if keeps == "" {
				keeps = "the region keeps version " + dash(c.before)
			}
			a.printf("%s: canary rolled back: %s; %s\n", r, why, keeps)
		} else {
			a.emitJSON(map[string]any{"region": r, "pop": cf.pop, "kind": c.kind, "verdict": "rolled_back", "why": why, "figures": v,
				"exit_code": ExitRolledBack, "reason": reasonOf(ExitRolledBack)})
		}
		return reported(ExitRolledBack, "canary rolled back: "+why)
	}

	loaded, err := a.waitCanaryLoaded(ctx, s, r, cf, c)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted while waiting for PoP %s to load the canary: %w", cf.pop, context.Cause(ctx))
		}
		return rolledBack(nil, err.Error())
	}
	a.progress("%s: canary: PoP %s runs %s %s; judging it for %s\n", r, cf.pop, c.what, c.version, cf.dur)
	select {
	case <-ctx.Done():
		return fmt.Errorf("interrupted during the canary of %s at PoP %s (the canary key is deleted, the region keeps its document)", r, cf.pop)
	case <-time.After(cf.dur):
	}
	// The figures must reach the window's end: wait (as long as --for at
	// most, never over a minute) for Prometheus to hold both sides' scrapes.
	waited, scraped := waitScraped(ctx, prometheus, r, cf.pop, loaded, time.Now(), min(cf.dur, maxScrapeWait), a.g.timeout)
	if !scraped {
		a.progress("%s: canary: Prometheus holds no scrape of PoP %s and of the rest of %s since the window ended (waited %s): the figures may be incomplete\n",
			r, cf.pop, r, waited.Round(time.Second))
	}
	window := time.Since(loaded)
	canary, rest, err := canaryFigures(ctx, prometheus, r, cf.pop, window, a.g.timeout)
	if err != nil {
		return fmt.Errorf("judging the canary of %s at PoP %s: %w", r, cf.pop, err)
	}
	v := cf.judge(canary, rest)
	a.progress("%s: canary figures over %s: PoP %s: %s; rest of %s: %s\n", r, window.Round(time.Second), cf.pop, canary, r, rest)
	log.Info("canary figures", "region", r, "pop", cf.pop, "window", window.Round(time.Second).String(),
		"scrape_wait", waited.Round(time.Millisecond).String(), "scraped_to_end", scraped,
		"canary_requests", canary.Requests, "canary_deny", canary.Deny, "canary_5xx", canary.Err5xx, "canary_shed", canary.Shed, "canary_fallback", canary.Fallback, "canary_refused", canary.Refused,
		"rest_requests", rest.Requests, "rest_deny", rest.Deny, "rest_5xx", rest.Err5xx, "rest_shed", rest.Shed, "rest_fallback", rest.Fallback)
	if !v.Promote {
		return rolledBack(&v, strings.Join(v.Reasons, "; "))
	}

	results, lines := c.promote()
	codes := make([]int, len(results))
	var failed []string
	for i, res := range results {
		codes[i] = res.ExitCode
		if res.ExitCode != ExitOK {
			failed = append(failed, res.Region+": "+res.Error)
		}
	}
	if code := combine(codes); code != ExitOK {
		if len(results) > 1 {
			// Some regions may have been written: say which.
			if a.json() {
				a.emitJSON(map[string]any{"region": r, "pop": cf.pop, "kind": c.kind, "verdict": "promoted", "figures": v, "results": results,
					"note": oneByOne, "exit_code": code, "reason": reasonOf(code)})
			} else {
				a.printf("%s\n", strings.Join(lines, "\n"))
			}
		}
		return &codedError{code: code, msg: fmt.Sprintf("canary passed, but promoting it failed: %s", strings.Join(failed, "; "))}
	}
	promoted = true
	res := &results[0] // the canary's region
	dctx, cancel := s.ctx()
	if derr := s.c.StopCanary(dctx, c.kind, r, cf.pop); derr != nil {
		warn := "could not delete " + key + " (it holds the promoted document, so nothing changes; delete it: consul kv delete -datacenter=" + r + " " + key + "): " + a.message(derr)
		res.Warning = strings.TrimPrefix(res.Warning+"; "+warn, "; ")
		lines[0] += "; warning: " + warn
	}
	cancel()
	log.Info("canary verdict", "region", r, "pop", cf.pop, "kind", string(c.kind), "verdict", "promoted", "version", c.version, "seq", res.Seq)
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "pop": cf.pop, "kind": c.kind, "verdict": "promoted", "figures": v, "results": results,
			"exit_code": ExitOK, "reason": reasonOf(ExitOK)})
		return nil
	}
	a.printf("%s: canary promoted\n%s\n", r, strings.Join(lines, "\n"))
	if len(results) > 1 {
		a.printf("all %s done\n", plural(len(results), "region"))
	}
	return nil
}

// waitCanaryLoaded waits until every healthy edge of the PoP reports the
// candidate's version in the catalog and returns when it saw that.
func (a *app) waitCanaryLoaded(ctx context.Context, s *session, r string, cf *canaryFlags, c candidate) (time.Time, error) {
	version := c.version
	ctx, cancel := context.WithTimeout(ctx, cf.loadTimeout)
	defer cancel()
	var index uint64
	var lagging []string
	// Each blocking read waits well under --timeout, which bounds every
	// Consul request: one waiting out --canary-load-timeout whole would be
	// cut off by it and read as Consul unreachable.
	wait := min(cf.loadTimeout, a.g.timeout/2)
	for {
		edges, next, err := s.c.Edges(ctx, r, index, wait)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return time.Time{}, fmt.Errorf("listing the edges of %s: %s", r, a.message(err))
		}
		index = next
		lagging = nil
		healthy := 0
		for _, e := range edges {
			if e.Healthy && e.Region == r && e.PoP == cf.pop {
				healthy++
				if got := c.reported(e); got != version {
					lagging = append(lagging, e.ID+" runs "+dash(got))
				}
			}
		}
		if healthy > 0 && len(lagging) == 0 {
			return time.Now(), nil
		}
		if healthy == 0 {
			lagging = []string{"no healthy edge left in the PoP"}
		}
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return time.Time{}, context.Cause(ctx)
	}
	return time.Time{}, fmt.Errorf("PoP %s did not load %s %s within %s (a refused document?): %s", cf.pop, c.what, version, cf.loadTimeout, strings.Join(lagging, ", "))
}

// progress prints a canary's step in text output (JSON output prints
// only the result; the log on stderr has the steps).
func (a *app) progress(format string, args ...any) {
	if !a.json() {
		a.printf(format, args...)
	}
}

func (f figures) String() string {
	return fmt.Sprintf("%.0f requests, deny %.4f, 5xx %.4f, shed %.4f, fallback %.4f, refused documents %g",
		f.Requests, f.Deny, f.Err5xx, f.Shed, f.Fallback, f.Refused)
}

// maxScrapeWait bounds waitScraped's wait (with --for): a candidate that
// stops its PoP's scrapes is rolled back at most this much later.
const maxScrapeWait = time.Minute

// waitScraped waits, for at most bound, until Prometheus holds, for the
// PoP's edges and for another PoP's of region r (a canary needs one to
// compare with), a scrape taken at or after end and two since loaded (what
// an increase needs): the figures then reach the window's end instead of
// stopping at the scrapes before it, a scrape interval or more earlier on
// a lagging Prometheus, where a short window held too few samples to count
// the PoP's requests. An edge's build_info series is there only while its
// last scrape succeeded, and its timestamp is that scrape's. It reports how
// long it waited and whether the scrapes came; a query that fails ends the
// wait (the figures' queries report it).
func waitScraped(ctx context.Context, promURL, r, pop string, loaded, end time.Time, bound, timeout time.Duration) (time.Duration, bool) {
	ask, err := vectorQuery(promURL, timeout)
	if err != nil {
		return 0, false
	}
	start := time.Now()
	deadline := start.Add(bound)
	for {
		latest, err := ask(ctx, fmt.Sprintf(`max by (pop) (timestamp(edgeguard_build_info{region=%q}))`, r), time.Now())
		if err != nil {
			return time.Since(start), false
		}
		count, err := ask(ctx, fmt.Sprintf(`max by (pop) (count_over_time(edgeguard_build_info{region=%q}[%s]))`, r, rangeOf(time.Since(loaded))), time.Now())
		if err != nil {
			return time.Since(start), false
		}
		enough := map[string]bool{}
		for _, s := range count {
			enough[string(s.Metric["pop"])] = s.Value >= 2
		}
		popDone, otherDone := false, false
		for _, s := range latest {
			p := string(s.Metric["pop"])
			done := enough[p] && !time.Unix(0, int64(float64(s.Value)*1e9)).Before(end)
			if p == pop {
				popDone = done
			} else {
				otherDone = otherDone || done
			}
		}
		if popDone && otherDone {
			return time.Since(start), true
		}
		if !time.Now().Before(deadline) {
			return time.Since(start), false
		}
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// vectorQuery asks Prometheus at promURL for instant vectors, each query
// bounded by timeout.
func vectorQuery(promURL string, timeout time.Duration) (func(ctx context.Context, q string, at time.Time) (model.Vector, error), error) {
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		return nil, fmt.Errorf("prometheus client: %w", err)
	}
	papi := promv1.NewAPI(c)
	return func(ctx context.Context, q string, at time.Time) (model.Vector, error) {
		qctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		v, _, _, err := papi.Query(qctx, q, at)
		if err != nil {
			return nil, fmt.Errorf("querying prometheus (%s): %w", q, err)
		}
		vec, ok := v.(model.Vector)
		if !ok {
			return nil, fmt.Errorf("querying prometheus (%s): unexpected %s result", q, v.Type())
		}
		return vec, nil
	}, nil
}

// rangeOf is a range selector's duration for window: whole seconds,
// rounded down (never a sample from before the PoP ran the candidate), at
// least one.
func rangeOf(window time.Duration) string {
	return fmt.Sprintf("%ds", max(int(window.Seconds()), 1))
}

// canaryFigures reads both sides' figures from Prometheus over window
// (ending now), by the pop label the edges' targets carry.
func canaryFigures(ctx context.Context, promURL, r, pop string, window, timeout time.Duration) (canary, rest figures, err error) {
	ask, err := vectorQuery(promURL, timeout)
	if err != nil {
		return canary, rest, err
	}
	w := rangeOf(window)
	now := time.Now()
	query := func(q string) (model.Vector, error) { return ask(ctx, q, now) }
	// side hands each series to add with the canary's figures or the
	// rest's, by its pop label.
	side := func(vec model.Vector, add func(f *figures, s *model.Sample)) {
		for _, s := range vec {
			f := &rest
			if string(s.Metric["pop"]) == pop {
				f = &canary
			}
			add(f, s)
		}
	}
	sel := fmt.Sprintf("region=%q", r)
	reqs, err := query(fmt.Sprintf(`sum by (pop, outcome) (increase(edgeguard_edge_requests_total{%s}[%s]))`, sel, w))
	if err != nil {
		return canary, rest, err
	}
	side(reqs, func(f *figures, s *model.Sample) {
		v := float64(s.Value)
		f.Requests += v
		switch s.Metric["outcome"] {
		case "denied":
			f.Deny += v
		case "shed":
			f.Shed += v
		}
	})
	errs, err := query(fmt.Sprintf(`sum by (pop) (increase(edgeguard_origin_responses_total{%s,code="5xx"}[%s]))`, sel, w))
	if err != nil {
		return canary, rest, err
	}
	side(errs, func(f *figures, s *model.Sample) { f.Err5xx += float64(s.Value) })
	// The edge's own 502/504 (and 503 for a full connection pool) for
	// origins it could not reach or that did not answer in time: an origin
	// that is down, or a pool pointed at the wrong one, shows here, not in
	// the origins' responses. Failures of the client's own body are not
	// the origin's.
	failed, err := query(fmt.Sprintf(`sum by (pop) (increase(edgeguard_origin_errors_total{%s,reason=~"connect|tls|timeout|other|no_free_conns"}[%s]))`, sel, w))
	if err != nil {
		return canary, rest, err
	}
	side(failed, func(f *figures, s *model.Sample) { f.Err5xx += float64(s.Value) })
	decs, err := query(fmt.Sprintf(`sum by (pop, reason) (increase(edgeguard_edge_decisions_total{%s}[%s]))`, sel, w))
	if err != nil {
		return canary, rest, err
	}
	decisions := map[*figures]float64{}
	side(decs, func(f *figures, s *model.Sample) {
		decisions[f] += float64(s.Value)
		if s.Metric["reason"] == "fallback" {
			f.Fallback += float64(s.Value)
		}
	})
	refused, err := query(fmt.Sprintf(`sum by (pop) (increase(edgeguard_edge_rules_rejected_total{%s}[%s]))`, sel, w))
	if err != nil {
		return canary, rest, err
	}
	side(refused, func(f *figures, s *model.Sample) { f.Refused += math.Round(float64(s.Value)) })
	for _, f := range []*figures{&canary, &rest} {
		if f.Requests > 0 {
			f.Deny, f.Shed, f.Err5xx = f.Deny/f.Requests, f.Shed/f.Requests, f.Err5xx/f.Requests
		}
		if decisions[f] > 0 {
			f.Fallback /= decisions[f]
		}
	}
	return canary, rest, nil
}
