// Package serverstats scrapes edges' admin /metrics (Prometheus exposition,
// parsed with prometheus/common/expfmt) and reports what changed between
// two scrapes: the server-side half of a load test's summary.
package serverstats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Snapshot is every sample of every scraped target, summed per series
// identity (metric name + chosen labels) later by Delta.
type Snapshot struct {
	// Targets maps a target URL to its metric families.
	Targets map[string]map[string]*dto.MetricFamily
}

// Scrape fetches each URL and parses it. Every target that fails is
// reported (errors.Join); the others are still returned.
func Scrape(ctx context.Context, client *http.Client, urls []string) (*Snapshot, error) {
	s := &Snapshot{Targets: map[string]map[string]*dto.MetricFamily{}}
	var errs []error
	for _, u := range urls {
		fams, err := scrapeOne(ctx, client, u)
		if err != nil {
			errs = append(errs, fmt.Errorf("scraping %s: %w", u, err))
			continue
		}
		s.Targets[u] = fams
	}
	return s, errors.Join(errs...)
}

func scrapeOne(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	return Parse(resp.Body, expfmt.ResponseFormat(resp.Header))
}

// Parse decodes one exposition in the given format.
func Parse(r io.Reader, format expfmt.Format) (map[string]*dto.MetricFamily, error) {
	dec := expfmt.NewDecoder(r, format)
	out := map[string]*dto.MetricFamily{}
	for {
		var mf dto.MetricFamily
		err := dec.Decode(&mf)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parsing metrics: %w", err)
		}
		out[mf.GetName()] = &mf
	}
}

// Sum adds the values of a counter or gauge family over every target,
// grouped by the values of the given labels ("" key when by is empty).
// Targets missing from the snapshot contribute nothing.
func (s *Snapshot) Sum(name string, by ...string) map[string]float64 {
	out := map[string]float64{}
	for _, fams := range s.Targets {
		mf, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			out[groupKey(m, by)] += v
		}
	}
	return out
}

// TargetSum is one target's sum of a family (0 when it lacks it).
func (s *Snapshot) TargetSum(target, name string) float64 {
	fams, ok := s.Targets[target]
	if !ok {
		return 0
	}
	return (&Snapshot{Targets: map[string]map[string]*dto.MetricFamily{target: fams}}).Sum(name)[""]
}

func groupKey(m *dto.Metric, by []string) string {
	if len(by) == 0 {
		return ""
	}
	parts := make([]string, len(by))
	for i, l := range by {
		val := "_none"
		for _, lp := range m.GetLabel() {
			if lp.GetName() == l {
				val = lp.GetValue()
			}
		}
		parts[i] = l + "=" + val
	}
	return strings.Join(parts, ",")
}

// Figure names one server-side figure of a summary: the increase of a
// counter family between two snapshots, summed over every edge, grouped by
// labels.
type Figure struct {
	Name   string   `json:"name"`
	Metric string   `json:"metric"`
	By     []string `json:"by,omitempty"`
}

// DefaultFigures are the deltas that matter for edgeguard runs.
func DefaultFigures() []Figure {
	return []Figure{
		{Name: "requests", Metric: "edgeguard_edge_requests_total", By: []string{"outcome"}},
		{Name: "requests_by_tier", Metric: "edgeguard_edge_requests_total", By: []string{"tier", "outcome"}},
		{Name: "decisions", Metric: "edgeguard_edge_decisions_total", By: []string{"decision", "reason"}},
		{Name: "fallback", Metric: "edgeguard_limiter_fallback_total", By: []string{"reason"}},
		{Name: "limiter_checks", Metric: "edgeguard_limiter_checks_total", By: []string{"reason"}},
		{Name: "script_calls", Metric: "edgeguard_limiter_store_calls_total"},
		{Name: "coalesced_checks", Metric: "edgeguard_limiter_coalesced_checks_total"},
		{Name: "prefilter_hits", Metric: "edgeguard_limiter_prefilter_hits_total"},
		{Name: "limiter_errors", Metric: "edgeguard_edge_limiter_errors_total"},
		{Name: "shed_ramp", Metric: "edgeguard_shedder_shed_total", By: []string{"tier"}},
		{Name: "shed_by_tier", Metric: "edgeguard_shedder_rejected_total", By: []string{"tier", "reason"}},
	}
}

// Report is the server-side part of a summary.
type Report struct {
	// Deltas maps a figure's name to its increases by label group; a
	// figure whose metric no edge exports is absent (see Missing).
	Deltas map[string]map[string]float64 `json:"deltas"`
	// Missing lists figures no target exported, so an absent figure is
	// told from a zero one.
	Missing []string `json:"missing,omitempty"`
	// ScriptCallsPerRequest is Redis script commands (a batch is one) per request the edges
	// handled (0 when they handled none).
	ScriptCallsPerRequest float64 `json:"script_calls_per_request"`
	// Resets lists targets where a counter went down (a restarted edge);
	// their deltas are taken from zero.
	Resets []string `json:"resets,omitempty"`
}

// Delta compares two snapshots.
func Delta(before, after *Snapshot, figures []Figure) Report {
	r := Report{Deltas: map[string]map[string]float64{}}
	reset := map[string]bool{}
	for _, f := range figures {
		seen := false
		groups := map[string]float64{}
		for target, fams := range after.Targets {
			mf, ok := fams[f.Metric]
			if !ok {
				continue
			}
			seen = true
			one := &Snapshot{Targets: map[string]map[string]*dto.MetricFamily{target: {f.Metric: mf}}}
			end := one.Sum(f.Metric, f.By...)
			var start map[string]float64
			if b, ok := before.Targets[target]; ok {
				start = (&Snapshot{Targets: map[string]map[string]*dto.MetricFamily{target: b}}).Sum(f.Metric, f.By...)
			}
			for k, v := range end {
				d := v - start[k]
				if d < 0 {
					reset[target] = true
					d = v
				}
				groups[k] += d
			}
		}
		if !seen {
			r.Missing = append(r.Missing, f.Name)
			continue
		}
		r.Deltas[f.Name] = groups
	}
	var reqs, calls float64
	for _, v := range r.Deltas["requests"] {
		reqs += v
	}
	for _, v := range r.Deltas["script_calls"] {
		calls += v
	}
	if reqs > 0 {
		r.ScriptCallsPerRequest = calls / reqs
	}
	for t := range reset {
		r.Resets = append(r.Resets, t)
	}
	sort.Strings(r.Resets)
	return r
}
