// Package promtext reads the Prometheus text format an edge's admin port
// serves, with Prometheus's own parser: one scrape by family name, and the
// sum of the series a label match selects. The tests and the region drills
// read the edges' metrics through it.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape, by family name.
type Families map[string]*dto.MetricFamily

// Parse reads a page in the text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return mfs, nil
}

// Scrape fetches url (a /metrics page) with c and parses it; an answer
// other than 200 is an error.
func Scrape(ctx context.Context, c *http.Client, url string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return f, nil
}

// Sum adds up the series of name whose labels include every pair of match
// (name, value, name, value...); 0 while there are none. A counter, gauge
// or untyped series adds its value, a histogram or summary its count of
// observations; name_sum and name_count read a histogram's or summary's
// sum and count, as the text format names them.
func Sum(f Families, name string, match ...string) float64 {
	mf, wantSum := f[name], false
	if mf == nil {
		if base, ok := strings.CutSuffix(name, "_sum"); ok {
			mf, wantSum = f[base], true
		} else if base, ok := strings.CutSuffix(name, "_count"); ok {
			mf = f[base]
		}
	}
	var total float64
	for _, s := range mf.GetMetric() {
		if !has(s, match...) {
			continue
		}
		switch {
		case s.Counter != nil:
			total += s.GetCounter().GetValue()
		case s.Gauge != nil:
			total += s.GetGauge().GetValue()
		case s.Untyped != nil:
			total += s.GetUntyped().GetValue()
		case s.Histogram != nil && wantSum:
			total += s.GetHistogram().GetSampleSum()
		case s.Histogram != nil:
			total += float64(s.GetHistogram().GetSampleCount())
		case s.Summary != nil && wantSum:
			total += s.GetSummary().GetSampleSum()
		case s.Summary != nil:
			total += float64(s.GetSummary().GetSampleCount())
		}
	}
	return total
}

// has reports whether series s has every label pair of match (name,
// value, name, value...).
func has(s *dto.Metric, match ...string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == match[i] && l.GetValue() == match[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
