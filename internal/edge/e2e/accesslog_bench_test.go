package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkAccessLogWrk measures what the access log costs in throughput:
// two edge processes with the same rules (memory store, every request
// proxied to a loopback origin and logged), one with --access-log FILE and
// one without, loaded by wrk in turn, EDGE_BENCH_ROUNDS times (default 6),
// the order swapped every round (off, on, on, off, …) so that a change in
// the machine's other load falls on both alike. Each round gives the ratio
// req/s with the log ÷ without, and the edge's CPU time per request
// without ÷ with (what the log costs in capacity when CPU is the limit,
// steadier than req/s on a shared machine); the benchmark reports their
// medians and the range of the first, and fails if the log dropped a line (a dropped line would make the
// log look cheaper than it is) or wrote fewer lines than it served requests.
//
//	go test ./internal/edge/e2e -run '^$' -bench BenchmarkAccessLogWrk -benchtime 1x
func BenchmarkAccessLogWrk(b *testing.B) {
	dur := envDuration(b, "EDGE_BENCH_DURATION", 8*time.Second)
	conns := envInt(b, "EDGE_BENCH_CONNS", 64)
	rounds := envInt(b, "EDGE_BENCH_ROUNDS", 6)
	script := writeBenchFile(b, "bench.lua", wrkScript)
	org := startBenchOrigin(b, 0, 0)
	rules := writeBenchFile(b, "rules.yaml", benchRuleHigh)
	logFile := filepath.Join(b.TempDir(), "access.log")
	args := []string{"--origin", org, "--trusted-proxies", "127.0.0.1", "--log-level", "warn", "--rules", rules}
	off := startEdge(b, args...)
	on := startEdge(b, append(args, "--access-log", logFile)...)

	var offRPS, onRPS, ratios, cpuRatios []float64
	var requestsOn float64
	var before metrics
	for b.Loop() {
		for _, e := range []*edgeProc{off, on} { // warm up: connections, the log file
			if _, err := runWrk("http://"+e.Addr+"/", script, "vary", 2, conns, time.Second); err != nil {
				b.Fatal(err)
			}
		}
		before = mustScrape(b, on)
		requestsOn = 0
		offRPS, onRPS, ratios, cpuRatios = nil, nil, nil, nil
		for r := range rounds {
			order := []*edgeProc{off, on}
			if r%2 == 1 {
				order = []*edgeProc{on, off}
			}
			rps, cpu := map[*edgeProc]float64{}, map[*edgeProc]float64{}
			for _, e := range order {
				cpuBefore := procCPUSeconds(b, e.Cmd.Process.Pid)
				w, err := runWrk("http://"+e.Addr+"/", script, "vary", 2, conns, dur)
				cpu[e] = (procCPUSeconds(b, e.Cmd.Process.Pid) - cpuBefore) / float64(w.requests) * 1e6
				if err != nil {
					b.Fatal(err)
				}
				// A response slower than wrk's 2 s timeout is a slow
				// response on a starved machine, not a wrong one; any other
				// error, or many timeouts, void the round.
				if bad := w.errConnect + w.errRead + w.errWrite + w.errStatus; bad > 0 || w.errTimeout*100 > w.requests {
					b.Fatalf("round %d: failed requests: %+v", r, w)
				}
				rps[e] = float64(w.requests) / (float64(w.durationUs) / 1e6)
				if e == on {
					requestsOn += float64(w.requests)
				}
			}
			offRPS, onRPS = append(offRPS, rps[off]), append(onRPS, rps[on])
			ratios = append(ratios, rps[on]/rps[off])
			cpuRatios = append(cpuRatios, cpu[off]/cpu[on])
			b.Logf("round %d (%s first): off %.0f req/s %.1f µs CPU/req, on %.0f req/s %.1f µs CPU/req; req/s on/off %.3f, CPU/req off/on %.3f",
				r+1, map[bool]string{true: "off", false: "on"}[r%2 == 0], rps[off], cpu[off], rps[on], cpu[on], rps[on]/rps[off], cpu[off]/cpu[on])
		}
	}
	// The writer is asynchronous: wait until it has caught up.
	var lines, dropped float64
	require.Eventually(b, func() bool {
		after, err := scrapeErr(on)
		if err != nil {
			return false
		}
		lines = sum(after, "edgeguard_edge_access_log_lines_total") - sum(before, "edgeguard_edge_access_log_lines_total")
		dropped = sum(after, "edgeguard_edge_access_log_dropped_total") - sum(before, "edgeguard_edge_access_log_dropped_total")
		return lines+dropped >= requestsOn
	}, 10*time.Second, 100*time.Millisecond, "the access log never caught up with the %.0f requests", requestsOn)
	if dropped > 0 {
		b.Fatalf("the access log dropped %.0f of %.0f lines: the figures would understate its cost", dropped, requestsOn)
	}
	if lines < requestsOn {
		b.Fatalf("the access log wrote %.0f lines for %.0f requests", lines, requestsOn)
	}
	st, err := os.Stat(logFile)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(median(offRPS), "off-req/s")
	b.ReportMetric(median(onRPS), "on-req/s")
	b.ReportMetric(median(ratios), "on/off")
	b.ReportMetric(slices.Min(ratios), "on/off-min")
	b.ReportMetric(slices.Max(ratios), "on/off-max")
	b.ReportMetric(median(cpuRatios), "cpu-off/on")
	b.ReportMetric(float64(st.Size())/lines, "bytes/line")
	b.Logf("%d rounds of %s, %d connections: req/s on/off median %.3f (%.3f–%.3f), edge CPU per request off/on median %.3f (%.3f–%.3f); %.0f lines written, none dropped",
		rounds, dur, conns, median(ratios), slices.Min(ratios), slices.Max(ratios), median(cpuRatios), slices.Min(cpuRatios), slices.Max(cpuRatios), lines)
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
