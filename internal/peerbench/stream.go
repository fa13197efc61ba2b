package peerbench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// StreamConfig is a run of Stream.
type StreamConfig struct {
	EdgeBin, NginxBin string
	Sets              int     // sets of measurements, each edge and nginx once, in alternating order
	Clients           int     // keep-alive clients at once
	Requests          int     // time-to-first-byte requests per client
	TTFBSize          int64   // object size of the time-to-first-byte runs
	Sizes             []int64 // object sizes of the CPU runs (none: time to first byte only)
	Volumes           []int64 // bytes fetched per CPU run, one for each size
	// Trace, when above 0, also takes an execution trace of the edge for
	// that long (whole seconds, at least one) after the sets, while the
	// clients fetch TTFBSize objects, and prints where each request's time
	// to first byte went inside the edge (ttfbtrace.go). The traced
	// requests are not in the sets' figures.
	Trace time.Duration
	Out   io.Writer
}

// DefaultStreamConfig is the measurement make bench-stream-peers runs.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{
		Sets: 3, Clients: 8, Requests: 200, TTFBSize: 4 << 20,
		Sizes:   []int64{1 << 10, 64 << 10, 4 << 20},
		Volumes: []int64{64 << 20, 1 << 30, 1 << 30},
		Out:     os.Stdout,
	}
}

// StreamResult holds every set's figures.
type StreamResult struct {
	TTFB map[string][]percentiles // by target (origin, edge, nginx), one per set
	// CPU seconds per GiB by target and size, one per set: the proxy's, the origin's.
	ProxyCPU, OriginCPU map[string]map[int64][]float64
	Bytes               int64       // every byte fetched, each checked
	NginxSpooled        int         // responses nginx wrote to a temporary file
	Phases              *TTFBPhases // the traced requests (StreamConfig.Trace), else nil
}

type percentiles struct{ p50, p99 time.Duration }

func pct(ds []time.Duration) percentiles {
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentiles{p50: quantile(s, 0.50), p99: quantile(s, 0.99)}
}

// quantile is the q-quantile of sorted (nearest rank); sorted must not be
// empty.
func quantile[T cmp.Ordered](sorted []T, q float64) T {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// Stream measures the origin directly, the edge and nginx: time to first
// byte, then CPU per GiB for each size, Sets times, the edge first in odd
// sets and nginx first in even ones. It prints each measurement as it is
// made and the summary at the end.
func Stream(ctx context.Context, cfg StreamConfig) (*StreamResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "peerbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	origin, err := startOrigin(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer origin.stop()
	var extra []string
	if cfg.Trace > 0 {
		if extra, err = traceArgs(dir); err != nil {
			return nil, err
		}
	}
	edge, err := startEdge(ctx, cfg.EdgeBin, dir, origin.addr, extra...)
	if err != nil {
		return nil, err
	}
	defer edge.stop()
	nginx, err := startNginx(ctx, cfg.NginxBin, dir, origin.addr, "1024m")
	if err != nil {
		return nil, err
	}
	defer nginx.stop()

	res := &StreamResult{TTFB: map[string][]percentiles{},
		ProxyCPU: map[string]map[int64][]float64{}, OriginCPU: map[string]map[int64][]float64{}}
	targets := map[string]*server{"origin": origin, "edge": edge, "nginx": nginx}
	w := cfg.Out
	fmt.Fprintf(w, "# set target measure values (TTFB: %d clients × %d requests of %s; CPU: %d clients)\n",
		cfg.Clients, cfg.Requests, size(cfg.TTFBSize), cfg.Clients)
	// One of each object from each target first, unmeasured: the origin
	// generates its in-memory object then, the connections open.
	for _, name := range []string{"origin", "edge", "nginx"} {
		for _, sz := range append([]int64{cfg.TTFBSize}, cfg.Sizes...) {
			if _, err := load(ctx, targets[name].addr, sz, cfg.Clients, cfg.Clients); err != nil {
				return res, fmt.Errorf("warming up %s: %w%s", name, err, nginxErrors(dir, name))
			}
		}
	}
	for set := 1; set <= cfg.Sets; set++ {
		fmt.Fprintf(w, "# set %d, load average %s\n", set, loadavg())
		order := []string{"origin", "edge", "nginx"}
		if set%2 == 0 {
			order = []string{"origin", "nginx", "edge"}
		}
		for _, name := range order {
			t := targets[name]
			ds, err := load(ctx, t.addr, cfg.TTFBSize, cfg.Clients, cfg.Clients*cfg.Requests)
			if err != nil {
				return res, fmt.Errorf("%s: %w%s", name, err, nginxErrors(dir, name))
			}
			res.Bytes += cfg.TTFBSize * int64(len(ds))
			p := pct(ds)
			res.TTFB[name] = append(res.TTFB[name], p)
			fmt.Fprintf(w, "%d %s ttfb p50=%s p99=%s\n", set, name, ms(p.p50), ms(p.p99))
			if name == "origin" {
				continue
			}
			for i, sz := range cfg.Sizes {
				n := max(1, int(cfg.Volumes[i]/sz))
				cpu0, ocpu0 := cpuSeconds(t.pid()), cpuSeconds(origin.pid())
				if _, err := load(ctx, t.addr, sz, cfg.Clients, n); err != nil {
					return res, fmt.Errorf("%s: %w%s", name, err, nginxErrors(dir, name))
				}
				gib := float64(int64(n)*sz) / (1 << 30)
				res.Bytes += int64(n) * sz
				pc, oc := (cpuSeconds(t.pid())-cpu0)/gib, (cpuSeconds(origin.pid())-ocpu0)/gib
				put(res.ProxyCPU, name, sz, pc)
				put(res.OriginCPU, name, sz, oc)
				fmt.Fprintf(w, "%d %s cpu size=%s requests=%d proxy-cpu-s/GiB=%.3f origin-cpu-s/GiB=%.3f\n", set, name, size(sz), n, pc, oc)
			}
		}
	}
	res.NginxSpooled = nginxSpooled(dir)
	res.print(w, cfg)
	if cfg.Trace > 0 {
		ph, err := traceEdge(ctx, edge, cfg.TTFBSize, cfg.Clients, cfg.Trace)
		if err != nil {
			return res, fmt.Errorf("tracing the edge: %w", err)
		}
		res.Phases = ph
		printPhases(w, ph)
	}
	return res, nil
}

func put(m map[string]map[int64][]float64, name string, sz int64, v float64) {
	if m[name] == nil {
		m[name] = map[int64][]float64{}
	}
	m[name][sz] = append(m[name][sz], v)
}

func (r *StreamResult) print(w io.Writer, cfg StreamConfig) {
	fmt.Fprintf(w, "\n# time to first byte, %s object, %d clients × %d requests; median over %d sets (min–max)\n",
		size(cfg.TTFBSize), cfg.Clients, cfg.Requests, cfg.Sets)
	fmt.Fprintf(w, "%-22s %-24s %s\n", "target", "p50 ms", "p99 ms")
	for _, name := range []string{"origin", "edge", "nginx"} {
		var p50, p99 []float64
		for _, p := range r.TTFB[name] {
			p50, p99 = append(p50, msf(p.p50)), append(p99, msf(p.p99))
		}
		fmt.Fprintf(w, "%-22s %-24s %s\n", name, spread(p50, "%.2f"), spread(p99, "%.2f"))
	}
	var q50, q99 []float64
	for i := range r.TTFB["edge"] {
		q50 = append(q50, msf(r.TTFB["edge"][i].p50)/msf(r.TTFB["nginx"][i].p50))
		q99 = append(q99, msf(r.TTFB["edge"][i].p99)/msf(r.TTFB["nginx"][i].p99))
	}
	fmt.Fprintf(w, "%-22s %-24s %s\n", "edge÷nginx (per set)", spread(q50, "%.2f"), spread(q99, "%.2f"))
	// The goal is stated against the origin: the first byte within a
	// millisecond of when it comes from the origin directly.
	for _, name := range []string{"edge", "nginx"} {
		var d50, d99 []float64
		for i := range r.TTFB[name] {
			d50 = append(d50, msf(r.TTFB[name][i].p50)-msf(r.TTFB["origin"][i].p50))
			d99 = append(d99, msf(r.TTFB[name][i].p99)-msf(r.TTFB["origin"][i].p99))
		}
		fmt.Fprintf(w, "%-22s %-24s %s\n", name+"−origin ms (per set)", spread(d50, "%+.2f"), spread(d99, "%+.2f"))
	}
	if len(cfg.Sizes) == 0 {
		fmt.Fprintf(w, "\nbytes fetched and checked: %d\n", r.Bytes)
		return
	}

	fmt.Fprintf(w, "\n# CPU seconds per GiB proxied; median over %d sets (min–max); ratios within each set\n", cfg.Sets)
	fmt.Fprintf(w, "%-6s %-24s %-24s %-18s %-27s %-27s %s\n", "size", "edge", "nginx", "edge÷nginx", "edge+origin", "nginx+origin", "edge÷nginx (+origin)")
	for _, sz := range cfg.Sizes {
		e, n := r.ProxyCPU["edge"][sz], r.ProxyCPU["nginx"][sz]
		eo, no := r.OriginCPU["edge"][sz], r.OriginCPU["nginx"][sz]
		var q, qo, et, nt []float64
		for i := range e {
			et, nt = append(et, e[i]+eo[i]), append(nt, n[i]+no[i])
			q, qo = append(q, ratio(e[i], n[i])), append(qo, ratio(et[i], nt[i]))
		}
		fmt.Fprintf(w, "%-6s %-24s %-24s %-18s %-27s %-27s %s\n", size(sz), spread(e, "%.3f"), spread(n, "%.3f"),
			spread(q, "%.2f"), spread(et, "%.3f"), spread(nt, "%.3f"), spread(qo, "%.2f"))
	}
	fmt.Fprintf(w, "\nnginx responses spooled to a temporary file: %d; bytes fetched and checked: %d\n", r.NginxSpooled, r.Bytes)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// spread is "median (min–max)" of vs, or the one value.
func spread(vs []float64, f string) string {
	if len(vs) == 0 {
		return "–"
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(f, m)
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", m, s[0], s[len(s)-1])
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.2fms", msf(d)) }

// size is n in B, KiB, MiB or GiB, whichever divides it.
func size(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return fmt.Sprintf("%d%s", n/u.n, u.s)
		}
	}
	return fmt.Sprintf("%dB", n)
}
