package peerbench

import (
	"fmt"
	"io"
	"maps"
	"slices"
)

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// measures are the table's rows for each scenario: a name and how to read
// it from a sample.
var measures = []struct {
	name string
	f    string
	of   func(sample) float64
}{
	{"proxy CPU µs/request", "%.1f", func(s sample) float64 { return s.proxyCPU * 1e6 }},
	{"proxy + origin CPU µs/request", "%.1f", func(s sample) float64 { return (s.proxyCPU + s.originCPU) * 1e6 }},
	{"requests/s (wrk)", "%.0f", func(s sample) float64 { return s.wrk.PerSecond }},
	{"p99 ms at half the peak rate", "%.2f", func(s sample) float64 { return msf(s.fixedP99) }},
}

// print writes the table: per scenario and measure, each proxy's median
// over the sets and the ratios to nginx, median (min–max) of the ratios
// within each set; the shed row's ratio is to the edge's own 429.
func (r *RequestsResult) print(w io.Writer, cfg RequestsConfig) {
	fmt.Fprintf(w, "| %d sets, median; ratios within each set, median (min–max) | edge | nginx | haproxy | edge÷nginx | haproxy÷nginx |\n", cfg.Sets)
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|")
	for _, sc := range cfg.picked() {
		for _, m := range measures {
			if m.name == measures[3].name && (cfg.FixedDuration == 0 || sc.h2) {
				continue
			}
			name := m.name
			if sc.h2 && name == measures[2].name {
				name = fmt.Sprintf("requests/s (h2load -c%d -m%d)", cfg.H2Clients, cfg.H2Streams)
			}
			vals := func(proxy string) []float64 {
				var vs []float64
				for _, s := range r.Samples[sc.name+"/"+proxy] {
					vs = append(vs, m.of(s))
				}
				return vs
			}
			med := func(proxy string) string {
				if vs := vals(proxy); len(vs) > 0 {
					return fmt.Sprintf(m.f, median(vs))
				}
				return "–"
			}
			ratios := func(a, b []float64) string {
				if len(a) == 0 || len(a) != len(b) {
					return "–"
				}
				q := make([]float64, len(a))
				for i := range a {
					q[i] = ratio(a[i], b[i])
				}
				return spread(q, "%.2f")
			}
			e, n, h := vals("edge"), vals("nginx"), vals("haproxy")
			en, hn := ratios(e, n), ratios(h, n)
			if sc.edgeOnly {
				var d []float64
				for _, s := range r.Samples["denied/edge"] {
					d = append(d, m.of(s))
				}
				en, hn = "÷ edge's 429: "+ratios(e, d), "–"
			}
			fmt.Fprintf(w, "| %s: %s | %s | %s | %s | %s | %s |\n", sc.what, name, med("edge"), med("nginx"), med("haproxy"), en, hn)
		}
	}
	if fs := r.Samples["floor/origin"]; len(fs) > 0 {
		var rps, cpu, p99 []float64
		for _, s := range fs {
			rps, cpu, p99 = append(rps, s.wrk.PerSecond), append(cpu, s.originCPU*1e6), append(p99, msf(s.fixedP99))
		}
		fmt.Fprintf(w, "\nfloor, the fasthttp origin alone (no proxy): %s requests/s, origin CPU %s µs/request, p99 at half the peak %s ms; median (min–max) over %d sets\n",
			spread(rps, "%.0f"), spread(cpu, "%.1f"), spread(p99, "%.2f"), len(fs))
	}
	var loads []string
	for _, key := range []string{"floor/origin"} {
		for _, s := range r.Samples[key] {
			loads = append(loads, s.loadAverage)
		}
	}
	fmt.Fprintf(w, "load average at the start of each set: %v\n", loads)
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
