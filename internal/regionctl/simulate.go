package regionctl

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// reproduceWithin is how close the replay of the current settings must
// follow the recorded shed level before a candidate's replay means anything.
const reproduceWithin = 0.05

// replayStep is the sampling interval of the replay: the edge samples
// utilization every 50 ms, and the recorded samples (one per scrape) are
// interpolated at this step.
const replayStep = 50 * time.Millisecond

var tierNames = []string{"test", "read", "write", "critical"}

// The command registers itself so the command table stays as it is.
func init() { commands["shedder simulate"] = (*app).shedderSimulate }

// shedder simulate --region R --pop P --from T1 --to T2 [key=value…]
//
// It reads the utilization each edge of the PoP recorded in Prometheus and
// replays it through pkg/shedder's own ramp: first with the region's
// current settings, which must reproduce the recorded shed level, then
// with the current settings changed by the key=value candidates. Where the
// edges recorded their origin latency, the same offered traffic also goes
// through the adaptive origin limit (open loop: see replayOrigin).
func (a *app) shedderSimulate(args []string) error {
	fs := a.flags("shedder simulate", "--region R --pop P --from T1 --to T2 [--prometheus URL] [key=value…]")
	var r, pop, from, to, promURL string
	regionVar(fs, &r)
	fs.StringVar(&pop, "pop", "", "PoP `name` whose edges to replay")
	fs.StringVar(&from, "from", "", "start of the window: RFC 3339 time or Unix seconds; pick a moment the PoP was not shedding")
	fs.StringVar(&to, "to", "", "end of the window: RFC 3339 time or Unix seconds")
	fs.StringVar(&promURL, "prometheus", a.env("PROMETHEUS_URL"), "Prometheus `URL` scraping the edges (default $PROMETHEUS_URL)")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	var problems []string
	if r == "" {
		problems = append(problems, "--region is required")
	}
	if pop == "" {
		problems = append(problems, "--pop is required")
	}
	if promURL == "" {
		problems = append(problems, "--prometheus (or $PROMETHEUS_URL) is required")
	}
	t1, err1 := parseTime(from)
	t2, err2 := parseTime(to)
	if err1 != nil {
		problems = append(problems, "--from: "+err1.Error())
	}
	if err2 != nil {
		problems = append(problems, "--to: "+err2.Error())
	}
	if err1 == nil && err2 == nil && !t2.After(t1) {
		problems = append(problems, "--to must be after --from")
	}
	kv := map[string]string{}
	for _, p := range pos {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			problems = append(problems, fmt.Sprintf("%q is not key=value", p))
			continue
		}
		kv[strings.TrimSpace(k)] = v
	}
	if len(problems) > 0 {
		return usagef("shedder simulate: %s", strings.Join(problems, "; "))
	}

	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	current, _, _, err := s.storedShedder(r)
	if err != nil {
		return err
	}
	candidate, err := shedder.ApplySettings(current, kv)
	if err != nil {
		return &codedError{code: ExitInvalid, err: fmt.Errorf("candidate settings: %w", err)}
	}
	if candidate.Smoothing != current.Smoothing {
		return usagef("shedder simulate: smoothing cannot be replayed: Prometheus holds the utilization already smoothed with the current %s", current.Smoothing)
	}

	ctx, cancel := context.WithTimeout(context.Background(), a.g.timeout)
	defer cancel()
	recs, err := fetchRecordings(ctx, promURL, r, pop, t1, t2)
	if err != nil {
		return err
	}

	report := simulateReport{Region: r, PoP: pop, From: t1, To: t2,
		Current: settingsVersionOf(current), Candidate: settingsVersionOf(candidate), Changes: kv}
	failed := false
	for _, rec := range recs {
		cur := replay(current, rec, len(recs))
		cand := replay(candidate, rec, len(recs))
		er := edgeReport{Instance: rec.instance, Samples: len(rec.util),
			Reproduced: cur.deviation <= reproduceWithin, Recorded: rec.shedTotals(), Current: cur, Candidate: cand}
		if !math.IsInf(cur.deviation, 0) {
			d := cur.deviation
			er.Deviation = &d
		}
		if !er.Reproduced {
			failed = true
		}
		report.Edges = append(report.Edges, er)
	}
	if a.json() {
		a.emitJSON(report)
	} else {
		a.printSimulation(report, current, candidate)
	}
	if failed {
		return reported(ExitError, fmt.Sprintf("the current settings do not reproduce the recorded shed level within %.2f: the window holds a settings change, an edge restart, or starts while the PoP was shedding", reproduceWithin))
	}
	return nil
}

type simulateReport struct {
	Region    string            `json:"region"`
	PoP       string            `json:"pop"`
	From      time.Time         `json:"from"`
	To        time.Time         `json:"to"`
	Current   string            `json:"current_version"`
	Candidate string            `json:"candidate_version"`
	Changes   map[string]string `json:"changes"`
	Edges     []edgeReport      `json:"edges"`
}

type edgeReport struct {
	Instance   string             `json:"instance"`
	Samples    int                `json:"samples"`
	Deviation  *float64           `json:"max_level_deviation"` // null: no recorded level to compare with
	Reproduced bool               `json:"reproduced"`
	Recorded   map[string]float64 `json:"recorded_shed"`
	Current    replayResult       `json:"current"`
	Candidate  replayResult       `json:"candidate"`
}

func settingsVersionOf(cfg shedder.Config) string { return shedder.SettingsVersion(cfg) }

// sample is one recorded value.
type sample struct {
	t time.Time
	v float64
}

// recording is one edge's recorded window.
type recording struct {
	instance string
	util     []sample // smoothed utilization, as the ramp saw it
	level    []sample
	offered  [4][]sample // counters per tier
	shed     [4][]sample
	// The adaptive origin limit's record (learned even while it is off):
	// each window's median origin latency, and the limit it learned.
	sampleRTT     []sample
	adaptiveLimit []sample
}

func (rec recording) shedTotals() map[string]float64 {
	out := map[string]float64{}
	for i, s := range rec.shed {
		out[tierNames[i]] = increase(s)
	}
	return out
}

// increase is a counter's growth over its samples, across resets.
func increase(s []sample) float64 {
	var total float64
	for i := 1; i < len(s); i++ {
		d := s[i].v - s[i-1].v
		if d < 0 {
			d = s[i].v // reset
		}
		total += d
	}
	return total
}

// replayResult is what a setting would have done over the window.
type replayResult struct {
	deviation  float64
	Shed       map[string]float64 `json:"shed"`
	Offered    map[string]float64 `json:"offered"`
	MaxLevel   float64            `json:"max_level"`
	MaxLevelAt time.Time          `json:"max_level_at"`
	FirstShed  *time.Time         `json:"first_shed,omitempty"`
	LastShed   *time.Time         `json:"last_shed,omitempty"`
	Timeline   []timelinePoint    `json:"timeline"`
	// Adaptive is the adaptive origin limit's replay; absent when the
	// window holds no recorded origin latency.
	Adaptive *adaptiveReplay `json:"adaptive,omitempty"`
}

// adaptiveReplay is what the adaptive limit would have learned and refused.
// The replay is open loop: each admitted request takes the origin latency
// recorded at its time, whatever the limit, so it shows how the settings
// read the recorded latency, not how the origin would have answered a
// different load.
type adaptiveReplay struct {
	Enabled    bool               `json:"enabled"`
	MinLimit   float64            `json:"min_limit"`
	MaxLimit   float64            `json:"max_limit"`
	FinalLimit float64            `json:"final_limit"`
	Recorded   *float64           `json:"recorded_final_limit"` // null where no limit was recorded
	Refused    map[string]float64 `json:"refused"`
}

type timelinePoint struct {
	T        time.Time `json:"t"`
	Util     float64   `json:"utilization"`
	Recorded *float64  `json:"recorded_level"` // null where no level was recorded
	Level    float64   `json:"level"`
	Cutoff   string    `json:"cutoff_tier"`
	Limit    *float64  `json:"adaptive_limit,omitempty"`
}

// replay feeds rec through a real Shedder with cfg. The recorded
// utilization is already smoothed, so the replay does not smooth again; it
// is interpolated linearly between samples at the edge's sampling step, and
// each tier's recorded offered requests are admitted evenly over each
// interval, so the cut-off works on the recorded tier shares. edges is how
// many edges the replay holds: they split adaptive.min_limit.
func replay(cfg shedder.Config, rec recording, edges int) replayResult {
	cfg.Smoothing = 0
	res := replayResult{Shed: map[string]float64{}, Offered: map[string]float64{}, MaxLevel: math.Inf(-1)}
	if len(rec.util) == 0 {
		res.deviation, res.MaxLevel = math.Inf(1), 0
		return res
	}
	matched := 0
	sh, err := shedder.New(cfg, nil, shedder.WithRandSource(rand.New(rand.NewPCG(1, 2))))
	if err != nil { // cfg was validated by ApplySettings
		panic(err)
	}
	sh.SetEdges(edges) // the replayed edges split adaptive.min_limit, as the edges did
	recorded := map[int64]float64{}
	for _, s := range rec.level {
		recorded[s.t.UnixMilli()] = s.v
	}
	offeredAt := make([]map[int64]float64, len(rec.offered))
	for i, s := range rec.offered {
		offeredAt[i] = map[int64]float64{}
		for _, x := range s {
			offeredAt[i][x.t.UnixMilli()] = x.v
		}
	}
	var carry [4]float64
	origin := newReplayOrigin(sh, rec)
	if origin != nil {
		res.Adaptive = &adaptiveReplay{Enabled: cfg.Adaptive.Enabled && cfg.Enabled, Refused: map[string]float64{},
			MinLimit: math.Inf(1), MaxLimit: math.Inf(-1)}
		if n := len(rec.adaptiveLimit); n > 0 {
			v := rec.adaptiveLimit[n-1].v
			res.Adaptive.Recorded = &v
		}
	}
	observe := func(t time.Time, u float64, sampleAt *sample) {
		sh.ObserveUtilization(t, u)
		lv := sh.Level()
		if lv > res.MaxLevel {
			res.MaxLevel, res.MaxLevelAt = lv, t
		}
		if sampleAt == nil {
			return
		}
		pt := timelinePoint{T: t, Util: u, Level: lv, Cutoff: sh.CutoffTier().String()}
		if origin != nil {
			l := sh.Adaptive().State().Limit
			pt.Limit = &l
		}
		if rl, ok := recorded[sampleAt.t.UnixMilli()]; ok {
			res.deviation = max(res.deviation, math.Abs(lv-rl))
			pt.Recorded = &rl
			matched++
		}
		res.Timeline = append(res.Timeline, pt)
	}
	first := rec.util[0]
	observe(first.t, first.v, &first)
	for i := 1; i < len(rec.util); i++ {
		prev, cur := rec.util[i-1], rec.util[i]
		dt := cur.t.Sub(prev.t)
		n := max(int(math.Ceil(float64(dt)/float64(replayStep))), 1)
		var perStep [4]float64
		for tier := range offeredAt {
			a, okA := offeredAt[tier][prev.t.UnixMilli()]
			b, okB := offeredAt[tier][cur.t.UnixMilli()]
			if okA && okB {
				d := b - a
				if d < 0 {
					d = b
				}
				perStep[tier] = d / float64(n)
				res.Offered[tierNames[tier]] += d
			}
		}
		for j := 1; j <= n; j++ {
			t := prev.t.Add(dt * time.Duration(j) / time.Duration(n))
			u := prev.v + (cur.v-prev.v)*float64(j)/float64(n)
			if j == n {
				observe(t, u, &cur)
			} else {
				observe(t, u, nil)
			}
			if origin != nil {
				origin.complete(t)
			}
			for tier := range perStep {
				carry[tier] += perStep[tier]
				for carry[tier] >= 1 {
					carry[tier]--
					if !sh.Admit(t, shedder.Tier(tier)) {
						res.Shed[tierNames[tier]]++
						if res.FirstShed == nil {
							at := t
							res.FirstShed = &at
						}
						at := t
						res.LastShed = &at
						continue
					}
					if origin != nil && !origin.send(t, shedder.Tier(tier)) {
						res.Adaptive.Refused[tierNames[tier]]++
					}
				}
			}
			if origin != nil {
				l := sh.Adaptive().State().Limit
				res.Adaptive.MinLimit = min(res.Adaptive.MinLimit, l)
				res.Adaptive.MaxLimit = max(res.Adaptive.MaxLimit, l)
				res.Adaptive.FinalLimit = l
			}
		}
	}
	if matched == 0 {
		res.deviation = math.Inf(1) // nothing to compare with: not reproduced
	}
	return res
}

// replayOrigin answers each request the adaptive limit admits after the
// origin latency recorded at the time it was sent.
type replayOrigin struct {
	sh      *shedder.Shedder
	rtt     []sample
	pending []replayExchange // ordered by end: latencies change slowly, so appends are nearly ordered
}

type replayExchange struct {
	end  time.Time
	rtt  time.Duration
	tier shedder.Tier
}

// newReplayOrigin returns nil when rec holds no origin latency.
func newReplayOrigin(sh *shedder.Shedder, rec recording) *replayOrigin {
	var rtt []sample
	for _, s := range rec.sampleRTT {
		if s.v > 0 {
			rtt = append(rtt, s)
		}
	}
	if len(rtt) == 0 {
		return nil
	}
	return &replayOrigin{sh: sh, rtt: rtt}
}

// latencyAt is the last latency recorded at or before t (the first one
// before it).
func (o *replayOrigin) latencyAt(t time.Time) time.Duration {
	i := sort.Search(len(o.rtt), func(i int) bool { return o.rtt[i].t.After(t) })
	if i > 0 {
		i--
	}
	return time.Duration(o.rtt[i].v * float64(time.Second))
}

// send offers a request of tier at t to the limit; false: refused.
func (o *replayOrigin) send(t time.Time, tier shedder.Tier) bool {
	if !o.sh.AcquireOrigin(t, tier) {
		return false
	}
	rtt := o.latencyAt(t)
	x := replayExchange{end: t.Add(rtt), rtt: rtt, tier: tier}
	i := sort.Search(len(o.pending), func(i int) bool { return o.pending[i].end.After(x.end) })
	o.pending = append(o.pending, replayExchange{})
	copy(o.pending[i+1:], o.pending[i:])
	o.pending[i] = x
	return true
}

// complete ends every exchange due by t.
func (o *replayOrigin) complete(t time.Time) {
	n := 0
	for n < len(o.pending) && !o.pending[n].end.After(t) {
		x := o.pending[n]
		o.sh.ReleaseOrigin(x.end, x.tier, x.rtt, true)
		n++
	}
	o.pending = o.pending[n:]
}

// fetchRecordings reads the raw samples of every edge of region/pop over
// [from, to] (range selectors, so every scrape is there at its own time).
func fetchRecordings(ctx context.Context, promURL, region, pop string, from, to time.Time) ([]recording, error) {
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		return nil, fmt.Errorf("prometheus client: %w", err)
	}
	p := promv1.NewAPI(c)
	rng := model.Duration(to.Sub(from).Round(time.Second) + time.Second).String()
	sel := fmt.Sprintf(`{region=%q, pop=%q}`, region, pop)
	query := func(metric string) (model.Matrix, error) {
		q := metric + sel + "[" + rng + "]"
		v, _, _, err := p.Query(ctx, q, to)
		if err != nil {
			return nil, fmt.Errorf("querying prometheus (%s): %w", q, err)
		}
		m, ok := v.(model.Matrix)
		if !ok {
			return nil, fmt.Errorf("querying prometheus (%s): unexpected %s result", q, v.Type())
		}
		return m, nil
	}
	byInstance := map[string]*recording{}
	get := func(inst string) *recording {
		if byInstance[inst] == nil {
			byInstance[inst] = &recording{instance: inst}
		}
		return byInstance[inst]
	}
	samples := func(s *model.SampleStream) []sample {
		out := make([]sample, 0, len(s.Values))
		for _, v := range s.Values {
			if t := v.Timestamp.Time(); !t.Before(from) && !t.After(to) {
				out = append(out, sample{t: t, v: float64(v.Value)})
			}
		}
		return out
	}
	util, err := query("edgeguard_shedder_utilization")
	if err != nil {
		return nil, err
	}
	if len(util) == 0 {
		return nil, fmt.Errorf("prometheus has no edgeguard_shedder_utilization for %s/%s between %s and %s", region, pop, from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	for _, s := range util {
		get(string(s.Metric["instance"])).util = samples(s)
	}
	level, err := query("edgeguard_shedder_level")
	if err != nil {
		return nil, err
	}
	for _, s := range level {
		get(string(s.Metric["instance"])).level = samples(s)
	}
	for _, c := range []struct {
		metric string
		dst    func(*recording) *[]sample
	}{
		{"edgeguard_shedder_adaptive_sample_rtt_seconds", func(r *recording) *[]sample { return &r.sampleRTT }},
		{"edgeguard_shedder_adaptive_limit", func(r *recording) *[]sample { return &r.adaptiveLimit }},
	} {
		m, err := query(c.metric)
		if err != nil {
			return nil, err
		}
		for _, s := range m {
			*c.dst(get(string(s.Metric["instance"]))) = samples(s)
		}
	}
	for _, c := range []struct {
		metric string
		dst    func(*recording) *[4][]sample
	}{
		{"edgeguard_shedder_requests_total", func(r *recording) *[4][]sample { return &r.offered }},
		{"edgeguard_shedder_shed_total", func(r *recording) *[4][]sample { return &r.shed }},
	} {
		m, err := query(c.metric)
		if err != nil {
			return nil, err
		}
		for _, s := range m {
			tier, err := shedder.ParseTier(string(s.Metric["tier"]))
			if err != nil {
				continue // a tier this version does not know
			}
			c.dst(get(string(s.Metric["instance"])))[tier] = samples(s)
		}
	}
	var out []recording
	for _, r := range byInstance {
		if len(r.util) > 0 {
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].instance < out[j].instance })
	return out, nil
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, fmt.Errorf("required")
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9)), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor Unix seconds", s)
}

func (a *app) printSimulation(rep simulateReport, current, candidate shedder.Config) {
	a.printf("# replaying %s/%s from %s to %s through the shedder's ramp (and the adaptive origin limit where origin latency was recorded)\n", rep.Region, rep.PoP, rep.From.Format(time.RFC3339), rep.To.Format(time.RFC3339))
	a.printf("# current settings %s: good=%v bad=%v start_after=%s full_after=%s\n", rep.Current, current.Good, current.Bad, current.StartAfter, current.FullAfter)
	var changes []string
	for k, v := range rep.Changes {
		changes = append(changes, k+"="+v)
	}
	sort.Strings(changes)
	a.printf("# candidate %s: %s\n", rep.Candidate, strings.Join(changes, " "))
	for _, e := range rep.Edges {
		a.printf("\nedge %s (%d samples)\n", e.Instance, e.Samples)
		verdict := "reproduce"
		if !e.Reproduced {
			verdict = "DO NOT reproduce"
		}
		if e.Deviation == nil {
			a.printf("  no recorded shed level in the window to compare the replay with\n")
			continue
		}
		a.printf("  the current settings %s the recorded shed level: max deviation %.3f (limit %.2f)\n", verdict, *e.Deviation, reproduceWithin)
		if !e.Reproduced {
			continue
		}
		a.printf("  %-8s %7s %9s %8s %10s %9s\n", "time", "util", "recorded", "current", "candidate", "cand. cut")
		every := max(len(e.Current.Timeline)/20, 1)
		for i := 0; i < len(e.Current.Timeline) && i < len(e.Candidate.Timeline); i += every {
			c, d := e.Current.Timeline[i], e.Candidate.Timeline[i]
			recorded := "-"
			if c.Recorded != nil {
				recorded = fmt.Sprintf("%.3f", *c.Recorded)
			}
			a.printf("  %-8s %7.2f %9s %8.3f %10.3f %9s\n", c.T.Format("15:04:05"), c.Util, recorded, c.Level, d.Level, d.Cutoff)
		}
		a.printf("  %-9s %9s %9s %9s %10s\n", "tier", "offered", "recorded", "current", "candidate")
		for _, tier := range tierNames {
			a.printf("  %-9s %9.0f %9.0f %9.0f %10.0f\n", tier, e.Current.Offered[tier], e.Recorded[tier], e.Current.Shed[tier], e.Candidate.Shed[tier])
		}
		if c, d := e.Current.Adaptive, e.Candidate.Adaptive; c != nil && d != nil {
			recorded := "-"
			if c.Recorded != nil {
				recorded = fmt.Sprintf("%.1f", *c.Recorded)
			}
			a.printf("  adaptive origin limit, replayed on the recorded origin latency (open loop): recorded %s at the end\n", recorded)
			a.printf("  %-9s %8s %7s %7s %7s %s\n", "settings", "enforced", "min", "max", "final", "refused (test/read/write/critical)")
			for _, x := range []struct {
				name string
				r    *adaptiveReplay
			}{{"current", c}, {"candidate", d}} {
				a.printf("  %-9s %8v %7.1f %7.1f %7.1f %.0f/%.0f/%.0f/%.0f\n", x.name, x.r.Enabled, x.r.MinLimit, x.r.MaxLimit, x.r.FinalLimit,
					x.r.Refused["test"], x.r.Refused["read"], x.r.Refused["write"], x.r.Refused["critical"])
			}
		}
		if e.Candidate.FirstShed != nil {
			a.printf("  candidate sheds from %s to %s, peak level %.3f at %s\n", e.Candidate.FirstShed.Format("15:04:05"), e.Candidate.LastShed.Format("15:04:05"), e.Candidate.MaxLevel, e.Candidate.MaxLevelAt.Format("15:04:05"))
		} else {
			a.printf("  candidate sheds nothing (peak level %.3f)\n", e.Candidate.MaxLevel)
		}
	}
}
