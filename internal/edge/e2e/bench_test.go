package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The edge under wrk, as a process: throughput, latency and CPU of the edge
// binary in front of an origin in the benchmark process, with limiting off,
// each store, a denied flood and the shedder on and off. Run it with
//
//	go test -run '^$' -bench BenchmarkEdgeWrk -benchtime 1x ./internal/edge/e2e/
//
// Each sub-benchmark starts its own edge, warms it up with a 1 s wrk run and
// measures one wrk run of a fixed duration; b.N is ignored, so -benchtime 1x
// is the right setting (it runs each function exactly once; a -benchtime
// duration longer than the wrk run would run the whole thing again). ns/op
// is meaningless here and reported as 0. Repeat whole runs (scripts/
// bench-edge.sh does) rather than -count N, which would run each
// configuration N times back to back instead of interleaving them.
//
// Settings (environment):
//
//	EDGE_BENCH_DURATION  measured wrk run per configuration (default 8s)
//	EDGE_BENCH_CONNS     wrk connections (default 64; 2 threads)
//	EDGE_BENCH_PPROF_DIR when set, a CPU profile of the edge is taken during
//	                     each measured run and written there as <case>.pprof
//
// The origin is a fasthttp server in the benchmark process, answering 200
// "ok\n" at once: a separate process from the edge, so the edge's CPU
// (read from /proc/<pid>/stat) is the edge's alone, and cheaper than the
// edge's built-in demo origin (JSON marshalling, in the edge's process).
//
// Every configuration runs the same wrk Lua script, which formats each
// request (so wrk costs the same everywhere) with an X-Forwarded-For the
// edge trusts (--trusted-proxies 127.0.0.1 in every configuration): "vary"
// gives each request a fresh client address (each wrk thread cycles through
// 65,536), so every limiter check is a different key and nothing coalesces;
// "fixed" sends one address. The limiting rule is one token_bucket keyed on
// ip with limit and burst 1,000,000 per second: nothing is denied.
//
// The configurations (sub-benchmarks), in the order they run:
//
//	off                   no rules: the edge is a pure proxy
//	memory                the rule, embedded memory store, vary
//	standalone            the rule on a standalone redis-server started here, vary
//	standalone-plain      the same with --redis-autopipeline=false
//	cluster               the rule on the shared Cluster (TestMain's), vary
//	cluster-plain         the same with --redis-autopipeline=false
//	cluster-hotkey        the same rule on the Cluster, fixed: one key, coalesced
//	standalone-leased     the rule keyed on host (one key: a tenant's quota)
//	                      with accuracy: leased, tolerance 0.05, vary: the
//	                      edge decides from allowances carved in batches
//	cluster-leased        the same on the Cluster
//	denied-flood          one key over its limit (1 per hour), fixed: every
//	                      measured request is a 429 from the over-limit cache
//	shedder-off           off with a shedder file {"enabled": false} (shadow mode)
//	shedder-on            off with a shedder file {"enabled": true}; nothing is shed
//	ratios                no wrk run: the table of ratios within this run
//	paired/<case>         only when the -bench pattern names "paired" (see
//	                      benchPaired): off and one configuration started
//	                      once and loaded in alternating slices, or both at
//	                      once (-together); aa is off against off, the
//	                      noise floor; -pinned binds the edges to CPU 0 and
//	                      wrk to CPU 1
//
// Every configuration runs at the edge's default flags but for --origin,
// --trusted-proxies, --key-salt, --log-level and what the list says: the
// Redis deadline is the default --redis-timeout, and every decision the
// fallback made is reported (fallbacks/run); more than 0.1% of checks fail
// the benchmark.
//
// Besides requests/s, latency and the edge's CPU per request, each
// configuration reports the edge's read and write system calls per request
// (syscr and syscw of /proc/<pid>/io), and Redis configurations the EVALSHA
// and CPU per request of all nodes and of the busiest master (a hot key's
// master). standalone and cluster (openLoop) then load this edge and a
// limiting-off edge, one after the other, at a fixed rate of half what wrk
// reached on this edge (an open-loop Go generator: latency counts from when
// each request was due, so a stall is not hidden by sending less), and
// report both p50s and p99s.

// wrkCase is one edge configuration under wrk.
type wrkCase struct {
	name    string
	rules   string   // rules YAML; "" = no rules
	store   string   // "" (memory), "standalone" or "cluster"
	xff     string   // "vary" or "fixed"
	shedder string   // shedder settings JSON; "" = no --shedder flag
	flags   []string // more edge flags
	status  int      // every measured response must have it
	// openLoop: after the wrk run, fixed-rate load at half the rate wrk
	// reached, on this edge and on a limiting-off edge, one after the other.
	openLoop bool
}

const (
	benchRuleHigh = `
version: 1
rules:
  - id: bench
    key: [ip]
    algorithm: token_bucket
    limit: 1000000
    window: 1s
    burst: 1000000
`
	// The high rule keyed on host, leased: every request spends from
	// the edge's allowance of one key.
	benchRuleLeased = `
version: 1
rules:
  - id: bench
    key: [host]
    algorithm: token_bucket
    limit: 1000000
    window: 1s
    burst: 1000000
    accuracy: leased
    tolerance: 0.05
`
	// One admission per hour: after the first request, the key is over its
	// limit and the edge's over-limit cache answers for about an hour.
	benchRuleDenied = `
version: 1
rules:
  - id: bench
    key: [ip]
    algorithm: sliding_log
    limit: 1
    window: 1h
`
)

var wrkCases = []wrkCase{
	{name: "off", xff: "vary", status: 200},
	{name: "memory", rules: benchRuleHigh, xff: "vary", status: 200},
	{name: "standalone", rules: benchRuleHigh, store: "standalone", xff: "vary", status: 200, openLoop: true},
	{name: "standalone-plain", rules: benchRuleHigh, store: "standalone", xff: "vary", flags: []string{"--redis-autopipeline=false"}, status: 200},
	{name: "cluster", rules: benchRuleHigh, store: "cluster", xff: "vary", status: 200, openLoop: true},
	{name: "cluster-plain", rules: benchRuleHigh, store: "cluster", xff: "vary", flags: []string{"--redis-autopipeline=false"}, status: 200},
	{name: "cluster-hotkey", rules: benchRuleHigh, store: "cluster", xff: "fixed", status: 200},
	{name: "standalone-leased", rules: benchRuleLeased, store: "standalone", xff: "vary", status: 200},
	{name: "cluster-leased", rules: benchRuleLeased, store: "cluster", xff: "vary", status: 200},
	{name: "denied-flood", rules: benchRuleDenied, store: "cluster", xff: "fixed", status: 429},
	{name: "shedder-off", xff: "vary", shedder: `{"enabled": false}`, status: 200},
	{name: "shedder-on", xff: "vary", shedder: `{"enabled": true}`, status: 200},
}

// wrkRun is what one measured run gave.
type wrkRun struct {
	rps, p50, p99, p999 float64 // req/s; latencies in ms
	requests            float64
	cpuPer1000          float64 // edge CPU seconds per 1000 requests
	scriptPerReq        float64 // edge-counted script calls per request (-1: no store)
	evalPerReq          float64 // EVALSHA the Redis masters served per request (-1: no Redis)
	redisCPUPer1000     float64 // Redis CPU seconds (all nodes) per 1000 requests (-1: no Redis)
	callsInFlight       float64 // mean store calls in flight (Σ call time / wall)
	coalescedFrac       float64 // checks that joined another request's call
	prefilterFrac       float64 // decisions by the over-limit cache
	fallbacks           float64
	shed                float64
	syscr, syscw        float64 // the edge's read and write system calls per request (/proc/PID/io)
	hotMasterCPUPer1000 float64 // the busiest master's CPU seconds per 1000 requests (-1: no Redis)
	hotMasterEvalPerReq float64 // the busiest master's EVALSHA per request (-1: no Redis)
	edgeCores           float64 // edge CPU seconds per second
	wrkCores, selfCores float64 // wrk's, and the benchmark process's (the origin)
	otherCores          float64 // machine busy time not of the edge, wrk, the origin or this run's Redis
	olRate              float64 // open loop: the fixed rate (req/s)
	olOff, olOn         openLoopRun
}

func BenchmarkEdgeWrk(b *testing.B) {
	if _, err := exec.LookPath("wrk"); err != nil {
		b.Fatal("wrk not installed: run make tools")
	}
	dur := envDuration(b, "EDGE_BENCH_DURATION", 8*time.Second)
	conns := envInt(b, "EDGE_BENCH_CONNS", 64)
	script := filepath.Join(b.TempDir(), "bench.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o600); err != nil {
		b.Fatal(err)
	}
	org := startBenchOrigin(b, 0, 0)
	// The limiting-off edge the open-loop runs compare with; idle otherwise.
	offEdge := startEdge(b, "--origin", org, "--trusted-proxies", "127.0.0.1", "--log-level", "warn")
	var standalone *testenv.Standalone
	defer func() {
		if standalone != nil {
			standalone.Close()
		}
	}()

	results := map[string]wrkRun{}
	for _, tc := range wrkCases {
		b.Run(tc.name, func(b *testing.B) {
			args := []string{"--origin", org, "--trusted-proxies", "127.0.0.1", "--log-level", "warn",
				"--key-salt", testenv.KeyPrefix(b)}
			if os.Getenv("EDGE_BENCH_PPROF_DIR") != "" {
				args = append(args, "--pprof")
			}
			args, redisNodes, masters := wrkStoreArgs(b, tc, args, &standalone)
			e := startEdge(b, append(args, tc.flags...)...)
			url := "http://" + e.Addr + "/"

			// Warm up: connections to the origin and Redis, the slot map,
			// and for the denied flood the key's one admission.
			if _, err := runWrk(url, script, tc.xff, 2, conns, time.Second); err != nil {
				b.Fatal(err)
			}
			r := measureWrk(b, tc, e, offEdge, url, script, conns, dur, redisNodes, masters)
			results[tc.name] = r
			reportWrk(b, tc, r)
		})
	}

	// Ratios within this run (the configurations ran seconds apart on the
	// same machine), as a last sub-benchmark so that its table is printed
	// without -v.
	b.Run("ratios", func(b *testing.B) { reportWrkRatios(b, results) })

	// The paired measure runs only when the -bench pattern names it: it
	// takes minutes per configuration, more than the rest together.
	if f := flag.Lookup("test.bench"); f != nil && strings.Contains(f.Value.String(), "paired") {
		b.Run("paired", func(b *testing.B) {
			for _, pc := range pairedCases {
				b.Run(pc.name, func(b *testing.B) { benchPaired(b, pc, org, script, conns, &standalone) })
			}
		})
	}
}

// wrkStoreArgs adds the case's store, rules and shedder to the edge's
// arguments, and returns the Redis nodes and masters to measure (none
// without Redis). The standalone Redis is started once, by the first case
// that needs it.
func wrkStoreArgs(b *testing.B, tc wrkCase, args []string, standalone **testenv.Standalone) (_ []string, redisNodes, masters []string) {
	switch tc.store {
	case "standalone":
		if *standalone == nil {
			var err error
			if *standalone, err = testenv.StartStandalone(testenv.StandaloneOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		redisNodes, masters = []string{(*standalone).Addr}, []string{(*standalone).Addr}
		args = append(args, "--redis", (*standalone).URL())
	case "cluster":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		masters, err = cluster.Masters(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		redisNodes = cluster.Addrs()
		args = append(args, "--redis", cluster.URL(), "--redis-mode", "cluster")
	}
	if tc.rules != "" {
		args = append(args, "--rules", writeBenchFile(b, "rules.yaml", tc.rules))
	}
	if tc.shedder != "" {
		args = append(args, "--shedder", writeBenchFile(b, "shedder.json", tc.shedder))
	}
	return args, redisNodes, masters
}

// measureWrk runs wrk against e for dur and reads what the run cost the
// edge, Redis and the machine; the open-loop cases then compare e with
// offEdge at half the rate wrk reached.
func measureWrk(b *testing.B, tc wrkCase, e, offEdge *edgeProc, url, script string, conns int, dur time.Duration, redisNodes, masters []string) wrkRun {
	before := mustScrape(b, e)
	evalBefore := evalCalls(b, masters)
	redisCPUBefore := redisCPU(b, redisNodes)
	mastersBefore := perNode(b, masters)
	ioBefore := procIO(b, e.Cmd.Process.Pid)
	cpuBefore := procCPUSeconds(b, e.Cmd.Process.Pid)
	selfBefore := procCPUSeconds(b, os.Getpid())
	busyBefore := machineBusySeconds(b)
	profDone := profileEdge(b, e, tc.name, dur)
	start := time.Now()
	w, err := runWrk(url, script, tc.xff, 2, conns, dur)
	wall := time.Since(start).Seconds()
	cpu := procCPUSeconds(b, e.Cmd.Process.Pid) - cpuBefore
	ioAfter := procIO(b, e.Cmd.Process.Pid)
	self := procCPUSeconds(b, os.Getpid()) - selfBefore
	busy := machineBusySeconds(b) - busyBefore
	<-profDone
	if err != nil {
		b.Fatal(err)
	}
	after := mustScrape(b, e)
	delta := func(name string, match ...string) float64 {
		return sum(after, name, match...) - sum(before, name, match...)
	}
	checkWrkResponses(b, tc, w, delta)

	n := float64(w.requests)
	r := wrkRun{
		rps: float64(w.requests) / (float64(w.durationUs) / 1e6),
		p50: float64(w.p50Us) / 1000, p99: float64(w.p99Us) / 1000, p999: float64(w.p999Us) / 1000,
		requests:            n,
		cpuPer1000:          cpu / n * 1000,
		scriptPerReq:        -1,
		evalPerReq:          -1,
		redisCPUPer1000:     -1,
		fallbacks:           delta(mFallback),
		shed:                delta("edgeguard_shedder_shed_total"),
		syscr:               float64(ioAfter.syscr-ioBefore.syscr) / n,
		syscw:               float64(ioAfter.syscw-ioBefore.syscw) / n,
		hotMasterCPUPer1000: -1,
		hotMasterEvalPerReq: -1,
		edgeCores:           cpu / wall,
		wrkCores:            w.cpu / wall,
		selfCores:           self / wall,
	}
	redisSecs := 0.0
	if decisions := delta(mDecisions); decisions > 0 {
		r.scriptPerReq = delta(mStoreDecisions) / n
		r.coalescedFrac = delta(mCoalesced) / decisions
		r.prefilterFrac = delta(mDecisions, "reason", "prefilter") / decisions
		r.callsInFlight = delta("edgeguard_limiter_store_call_duration_seconds_sum") / wall
	}
	if len(masters) > 0 {
		r.evalPerReq = float64(evalCalls(b, masters)-evalBefore) / n
		redisSecs = redisCPU(b, redisNodes) - redisCPUBefore
		r.redisCPUPer1000 = redisSecs / n * 1000
		for a, now := range perNode(b, masters) {
			r.hotMasterCPUPer1000 = max(r.hotMasterCPUPer1000, (now.cpu-mastersBefore[a].cpu)/n*1000)
			r.hotMasterEvalPerReq = max(r.hotMasterEvalPerReq, float64(now.evalsha-mastersBefore[a].evalsha)/n)
		}
	}
	r.otherCores = max(0, busy-cpu-w.cpu-self-redisSecs) / wall
	if tc.openLoop {
		rate := r.rps / 2
		offRun, onRun := openLoopPair(b, offEdge, e, rate, dur)
		r.olRate = rate
		r.olOff, r.olOn = offRun, onRun
		final := mustScrape(b, e)
		r.fallbacks += sum(final, mFallback) - sum(after, mFallback)
	}
	// A Redis call slower than --redis-timeout falls back to the
	// local store: a few are the machine stalling, more and the
	// measure is not of the store any more.
	// They are reported (fallbacks/run), not failed: the summary
	// says which runs had any.
	if r.fallbacks > 0 {
		b.Logf("%.0f checks (%.3f%%) fell back to the local store (calls slower than --redis-timeout)", r.fallbacks, 100*r.fallbacks/n)
	}
	if r.shed > 0 {
		b.Errorf("%.0f requests shed", r.shed)
	}
	return r
}

// checkWrkResponses fails the case unless every response was the one
// expected: otherwise the numbers measure something else (errors,
// fallbacks, shedding). delta is a metric's change over the run.
func checkWrkResponses(b *testing.B, tc wrkCase, w wrkResult, delta func(name string, match ...string) float64) {
	if bad := w.errConnect + w.errRead + w.errWrite + w.errTimeout; bad > 0 {
		b.Errorf("wrk socket errors: connect %d, read %d, write %d, timeout %d", w.errConnect, w.errRead, w.errWrite, w.errTimeout)
	}
	switch tc.status {
	case 200:
		if w.errStatus != 0 {
			b.Errorf("%d of %d responses were not 2xx/3xx", w.errStatus, w.requests)
		}
	default:
		if w.errStatus != w.requests {
			b.Errorf("%d of %d responses were 4xx/5xx, want all %d", w.errStatus, w.requests, tc.status)
		}
	}
	edgeReqs := delta(mRequests)
	if want := map[int]string{200: "proxied", 429: "denied"}[tc.status]; delta(mRequests, "outcome", want) != edgeReqs {
		b.Errorf("edge outcomes: %.0f of %.0f requests %s", delta(mRequests, "outcome", want), edgeReqs, want)
	}
}

// reportWrk reports one case's figures.
func reportWrk(b *testing.B, tc wrkCase, r wrkRun) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.rps, "req/s")
	b.ReportMetric(r.p50, "p50-ms")
	b.ReportMetric(r.p99, "p99-ms")
	b.ReportMetric(r.cpuPer1000, "edge-cpu-s/1000req")
	b.ReportMetric(r.edgeCores, "edge-cores")
	b.ReportMetric(r.otherCores, "other-cores")
	b.ReportMetric(r.syscr, "edge-syscr/req")
	b.ReportMetric(r.syscw, "edge-syscw/req")
	b.ReportMetric(r.fallbacks, "fallbacks/run")
	if tc.openLoop {
		b.ReportMetric(r.olRate, "ol-rate")
		b.ReportMetric(r.olOff.p50, "ol-off-p50-ms")
		b.ReportMetric(r.olOff.p99, "ol-off-p99-ms")
		b.ReportMetric(r.olOn.p50, "ol-p50-ms")
		b.ReportMetric(r.olOn.p99, "ol-p99-ms")
		b.ReportMetric(r.olOff.failed+r.olOn.failed, "ol-failed")
		b.Logf("open loop at %.0f req/s: off p50 %.3f p99 %.3f ms (%.0f req/s sent); %s p50 %.3f p99 %.3f ms (%.0f req/s sent)",
			r.olRate, r.olOff.p50, r.olOff.p99, r.olOff.sentRate, tc.name, r.olOn.p50, r.olOn.p99, r.olOn.sentRate)
	}
	if r.scriptPerReq >= 0 {
		b.ReportMetric(r.scriptPerReq, "script-calls/req")
	}
	if r.evalPerReq >= 0 {
		b.ReportMetric(r.evalPerReq, "redis-evalsha/req")
		b.ReportMetric(r.redisCPUPer1000, "redis-cpu-s/1000req")
		b.ReportMetric(r.callsInFlight, "calls-in-flight")
		b.ReportMetric(r.hotMasterCPUPer1000, "hot-master-cpu-s/1000req")
		b.ReportMetric(r.hotMasterEvalPerReq, "hot-master-evalsha/req")
	}
	b.Logf("| %s | %.0f | %.2f | %.2f | %.3f | %s | %s | %.1f%% | %.1f%% | edge %.2f, wrk %.2f, origin %.2f, others %.2f cores |", tc.name, r.rps, r.p50, r.p99, r.cpuPer1000,
		optional(r.scriptPerReq, "%.3f"), optional(r.redisCPUPer1000, "%.3f"), 100*r.coalescedFrac, 100*r.prefilterFrac,
		r.edgeCores, r.wrkCores, r.selfCores, r.otherCores)
}

// reportWrkRatios reports each case against its baseline (off, or
// shedder-off for shedder-on) and prints the table.
func reportWrkRatios(b *testing.B, results map[string]wrkRun) {
	off, ok := results["off"]
	if !ok {
		b.Skip("off did not run")
	}
	b.ReportMetric(0, "ns/op")
	var tbl strings.Builder
	tbl.WriteString("\n| configuration | req/s | ÷ off | p50 ms | p50 added | p99 ms | p99 added | edge CPU s / 1000 req | limiter CPU ÷ request CPU | syscalls r+w / req | script calls / req | fallbacks | other load (cores) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, tc := range wrkCases {
		r, ok := results[tc.name]
		if !ok {
			continue
		}
		base, baseName := off, "off"
		if tc.name == "shedder-on" {
			if so, ok := results["shedder-off"]; ok {
				base, baseName = so, "shedder-off"
			}
		}
		if tc.name != baseName {
			b.ReportMetric(r.rps/base.rps, tc.name+"/"+baseName)
		}
		if tc.name != baseName && r.scriptPerReq >= 0 {
			b.ReportMetric((r.cpuPer1000-base.cpuPer1000)/base.cpuPer1000, tc.name+"/limiter-cpu-ratio")
		}
		fmt.Fprintf(&tbl, "| %s | %.0f | %.3f | %.2f | %+.2f | %.2f | %+.2f | %.3f | %.2f | %.2f + %.2f | %s | %.0f | %.2f |\n", tc.name, r.rps, r.rps/base.rps,
			r.p50, r.p50-base.p50, r.p99, r.p99-base.p99, r.cpuPer1000, (r.cpuPer1000-base.cpuPer1000)/base.cpuPer1000, r.syscr, r.syscw,
			optional(r.scriptPerReq, "%.3f"), r.fallbacks, r.otherCores)
	}
	tbl.WriteString("(shedder-on is compared with shedder-off, everything else with off)")
	b.Logf("%s", tbl.String())
}

func optional(v float64, format string) string {
	if v < 0 {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// wrkScript formats every request, with X-Forwarded-For from the mode given
// after "--": "vary" (a fresh address per request, 65,536 per thread) or
// "fixed" (203.0.113.7). done() prints the figures on one line.
const wrkScript = `
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
end

local mode = "vary"
local n = 0
function init(args)
  if args[1] then mode = args[1] end
end

function request()
  local ip = "203.0.113.7"
  if mode == "vary" then
    n = n + 1
    ip = string.format("10.%d.%d.%d", tid % 256, math.floor(n / 256) % 256, n % 256)
  end
  return wrk.format(nil, nil, {["X-Forwarded-For"] = ip})
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d p999_us=%d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
`

type wrkResult struct {
	cpu                                                  float64 // wrk's CPU seconds
	requests, durationUs                                 int64
	errConnect, errRead, errWrite, errStatus, errTimeout int64
	p50Us, p99Us, p999Us                                 int64
}

// runWrk runs wrk with the script for d and parses its WRK line.
func runWrk(url, script, mode string, threads, conns int, d time.Duration) (wrkResult, error) {
	return runWrkOn("", url, script, mode, threads, conns, d)
}

// runWrkOn is runWrk with wrk bound to the CPUs of cpus (taskset's list
// syntax; "" = any CPU).
func runWrkOn(cpus, url, script, mode string, threads, conns int, d time.Duration) (wrkResult, error) {
	argv := []string{"wrk", "-t" + strconv.Itoa(threads), "-c" + strconv.Itoa(conns), "-d" + strconv.Itoa(int(d/time.Second)) + "s",
		"--latency", "-s", script, url, "--", mode}
	if cpus != "" {
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	var line string
	for l := range strings.Lines(string(out)) {
		if strings.HasPrefix(l, "WRK ") {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		return wrkResult{}, fmt.Errorf("wrk printed no summary:\n%s", out)
	}
	var r wrkResult
	fields := map[string]*int64{"requests": &r.requests, "duration_us": &r.durationUs, "connect": &r.errConnect, "read": &r.errRead,
		"write": &r.errWrite, "status": &r.errStatus, "timeout": &r.errTimeout, "p50_us": &r.p50Us, "p99_us": &r.p99Us, "p999_us": &r.p999Us}
	for f := range strings.FieldsSeq(strings.TrimPrefix(line, "WRK ")) {
		k, v, _ := strings.Cut(f, "=")
		p, ok := fields[k]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return wrkResult{}, fmt.Errorf("wrk summary %q: %w", line, err)
		}
		*p = n
	}
	r.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	if r.requests == 0 || r.durationUs == 0 {
		return wrkResult{}, fmt.Errorf("wrk made no requests:\n%s", out)
	}
	return r, nil
}

// ---------------------------------------------------------------------------
// Paired, interleaved: one configuration against off, with the machine's
// drift cancelled within each pair.

// pairedCase is one paired measure: edge A (off: no rules) against edge B,
// both started once and loaded in turn.
type pairedCase struct {
	name string
	b    wrkCase // B's configuration; A is always off
	// pin binds both edges to CPU 0 and wrk to CPU 1 (the origin, in the
	// benchmark process, and Redis are not bound).
	pin bool
	// together loads both edges at the same time, a wrk each, instead of
	// in turn: each pair is one slice, both edges under the same machine.
	together bool
}

var pairedCases = []pairedCase{
	{name: "aa", b: wrkCase{name: "off", xff: "vary", status: 200}},
	{name: "aa-pinned", b: wrkCase{name: "off", xff: "vary", status: 200}, pin: true},
	{name: "standalone-leased", b: wrkCaseNamed("standalone-leased")},
	{name: "cluster-leased", b: wrkCaseNamed("cluster-leased")},
	{name: "standalone-leased-pinned", b: wrkCaseNamed("standalone-leased"), pin: true},
	{name: "cluster-leased-pinned", b: wrkCaseNamed("cluster-leased"), pin: true},
	{name: "aa-together", b: wrkCase{name: "off", xff: "vary", status: 200}, together: true},
	{name: "standalone-leased-together", b: wrkCaseNamed("standalone-leased"), together: true},
	{name: "cluster-leased-together", b: wrkCaseNamed("cluster-leased"), together: true},
}

func wrkCaseNamed(name string) wrkCase {
	for _, tc := range wrkCases {
		if tc.name == name {
			return tc
		}
	}
	panic("no wrk case " + name)
}

// pairedSlice is what one slice of wrk on one edge gave.
type pairedSlice struct {
	rps, requests float64
	cpuPerReq     float64 // the edge's CPU seconds per request
	scripts       float64 // script calls the edge counted
	evalsha       float64 // EVALSHA the Redis masters served
	fallbacks     float64
}

// benchPaired measures pc: both edges are started once, warmed up, then
// loaded by wrk in turn for EDGE_BENCH_SLICE each, EDGE_BENCH_PAIRS pairs,
// the order flipped every pair (A B, B A, A B, …: each pair's two slices
// are adjacent, and a drift that is linear over a pair of pairs cancels).
// Each pair gives B's req/s ÷ A's and B's edge CPU per request minus A's,
// ÷ A's (CPU from /proc/<pid>/stat of the edge loaded in that slice); the
// figures are the median of the pairs, their interquartile range and a
// bootstrap 95% interval of the median. Every pair is logged on a PAIR line
// (all of them with -v; scripts/bench-edge.sh paired pools them over runs).
//
// A together case loads both edges at the same instant instead, a wrk of
// the same connections each: each pair is one slice, and whatever else the
// machine runs meanwhile falls on both alike. The edges then share the
// cores, so each serves about half of what it serves alone; the ratio is
// that of two edges competing for the same CPU, close to the inverse ratio
// of their CPU per request when both are CPU-bound.
//
// Settings: EDGE_BENCH_PAIRS (default 12), EDGE_BENCH_SLICE (default 3s),
// EDGE_BENCH_CONNS and EDGE_BENCH_PPROF_DIR (a profile of B over the pairs,
// paired-<case>.pprof, and of A over the same pairs, paired-<case>-off.pprof,
// the base of a diff: go tool pprof -diff_base; it costs each edge a little,
// so take ratios without it) as for the other configurations.
func benchPaired(b *testing.B, pc pairedCase, org, script string, conns int, standalone **testenv.Standalone) {
	pairs := envInt(b, "EDGE_BENCH_PAIRS", 12)
	slice := envDuration(b, "EDGE_BENCH_SLICE", 3*time.Second)
	base := []string{"--origin", org, "--trusted-proxies", "127.0.0.1", "--log-level", "warn", "--key-salt", testenv.KeyPrefix(b)}
	argsA := slices.Clone(base)
	argsB, _, masters := wrkStoreArgs(b, pc.b, slices.Clone(base), standalone)
	if os.Getenv("EDGE_BENCH_PPROF_DIR") != "" {
		argsA, argsB = append(argsA, "--pprof"), append(argsB, "--pprof")
	}
	a := startEdge(b, argsA...)
	e := startEdge(b, append(argsB, pc.b.flags...)...)
	wrkCPUs := ""
	if pc.pin {
		for _, p := range []*edgeProc{a, e} {
			if out, err := exec.Command("taskset", "-a", "-p", "-c", "0", strconv.Itoa(p.Cmd.Process.Pid)).CombinedOutput(); err != nil {
				b.Fatalf("taskset: %v\n%s", err, out)
			}
		}
		wrkCPUs = "1"
	}
	edges := [2]*edgeProc{a, e}
	cases := [2]wrkCase{{name: "off", xff: "vary", status: 200}, pc.b}
	for _, p := range edges {
		if _, err := runWrkOn(wrkCPUs, "http://"+p.Addr+"/", script, "vary", 2, conns, 2*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	load1 := []float64{loadAverage(b)}
	// With EDGE_BENCH_PPROF_DIR, B's and A's CPU profiles over all the
	// pairs (idle slices add no samples): the profile view of what B spends,
	// and A's under the same load to diff it against.
	slicesPerPair := 2
	if pc.together {
		slicesPerPair = 1
	}
	profDone := profileEdge(b, e, "paired-"+pc.name, time.Duration(pairs*slicesPerPair)*slice)
	profDoneA := profileEdge(b, a, "paired-"+pc.name+"-off", time.Duration(pairs*slicesPerPair)*slice)
	busyBefore, start := machineBusySeconds(b), time.Now()
	var rpsRatio, cpuRatio []float64
	var sumB pairedSlice
	var fallbacks float64
	for i := range pairs {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		var got [2]pairedSlice
		if pc.together {
			got = measureTogether(b, cases, edges, script, conns, slice, masters)
		} else {
			for _, k := range order {
				got[k] = measureSlice(b, cases[k], edges[k], wrkCPUs, script, conns, slice, masters)
			}
		}
		fallbacks += got[0].fallbacks + got[1].fallbacks
		rpsRatio = append(rpsRatio, got[1].rps/got[0].rps)
		cpuRatio = append(cpuRatio, (got[1].cpuPerReq-got[0].cpuPerReq)/got[0].cpuPerReq)
		sumB.requests += got[1].requests
		sumB.scripts += got[1].scripts
		sumB.evalsha += got[1].evalsha
		b.Logf("PAIR case=%s pair=%d order=%s rps_a=%.0f rps_b=%.0f cpu_us_a=%.2f cpu_us_b=%.2f req_b=%.0f scripts_b=%.0f evalsha_b=%.0f",
			pc.name, i+1, pairOrder(pc, i), got[0].rps, got[1].rps,
			got[0].cpuPerReq*1e6, got[1].cpuPerReq*1e6, got[1].requests, got[1].scripts, got[1].evalsha)
	}
	busyCores := (machineBusySeconds(b) - busyBefore) / time.Since(start).Seconds()
	<-profDone
	<-profDoneA
	load1 = append(load1, loadAverage(b))
	b.Logf("LOAD case=%s load1_start=%.2f load1_end=%.2f busy_cores=%.2f", pc.name, load1[0], load1[1], busyCores)
	if fallbacks > 0 {
		b.Logf("%.0f checks fell back to the local store (calls slower than --redis-timeout)", fallbacks)
	}

	rs, cs := summarizePairs(rpsRatio), summarizePairs(cpuRatio)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(pairs), "pairs")
	b.ReportMetric(rs.median, "rps-ratio")
	b.ReportMetric(rs.p25, "rps-ratio-p25")
	b.ReportMetric(rs.p75, "rps-ratio-p75")
	b.ReportMetric(rs.lo, "rps-ratio-ci-lo")
	b.ReportMetric(rs.hi, "rps-ratio-ci-hi")
	b.ReportMetric(cs.median, "cpu-ratio")
	b.ReportMetric(cs.p25, "cpu-ratio-p25")
	b.ReportMetric(cs.p75, "cpu-ratio-p75")
	b.ReportMetric(cs.lo, "cpu-ratio-ci-lo")
	b.ReportMetric(cs.hi, "cpu-ratio-ci-hi")
	b.ReportMetric(sumB.scripts/sumB.requests, "script-calls/req")
	b.ReportMetric(sumB.evalsha/sumB.requests, "redis-evalsha/req")
	b.ReportMetric(fallbacks, "fallbacks/run")
	b.ReportMetric(max(load1[0], load1[1]), "load1")
	b.ReportMetric(busyCores, "busy-cores")
	b.Logf("%s ÷ off over %d pairs of %s: req/s %.3f [IQR %.3f–%.3f, 95%% CI %.3f–%.3f]; CPU per request (B − A) ÷ A %.3f [IQR %.3f–%.3f, 95%% CI %.3f–%.3f]; script calls / req %.4f, EVALSHA / req %.4f",
		pc.name, pairs, slice, rs.median, rs.p25, rs.p75, rs.lo, rs.hi, cs.median, cs.p25, cs.p75, cs.lo, cs.hi,
		sumB.scripts/sumB.requests, sumB.evalsha/sumB.requests)
}

func pairOrder(pc pairedCase, i int) string {
	switch {
	case pc.together:
		return "together"
	case i%2 == 1:
		return "BA"
	}
	return "AB"
}

// measureSlice runs wrk on e for d and reads the edge's CPU, its script
// calls and the masters' EVALSHA over it; the responses are checked as in
// the other configurations.
func measureSlice(b *testing.B, tc wrkCase, e *edgeProc, wrkCPUs, script string, conns int, d time.Duration, masters []string) pairedSlice {
	s := beginSlice(b, e, masters)
	w, err := runWrkOn(wrkCPUs, "http://"+e.Addr+"/", script, tc.xff, 2, conns, d)
	if err != nil {
		b.Fatal(err)
	}
	return s.end(b, tc, w)
}

// measureTogether runs a wrk on each edge at the same time for d; only B
// talks to Redis, so the masters' EVALSHA are B's.
func measureTogether(b *testing.B, tcs [2]wrkCase, edges [2]*edgeProc, script string, conns int, d time.Duration, masters []string) [2]pairedSlice {
	s := [2]*sliceStart{beginSlice(b, edges[0], nil), beginSlice(b, edges[1], masters)}
	var w [2]wrkResult
	var errs [2]error
	var wg sync.WaitGroup
	for k := range 2 {
		wg.Go(func() { w[k], errs[k] = runWrk("http://"+edges[k].Addr+"/", script, tcs[k].xff, 2, conns, d) })
	}
	wg.Wait()
	var got [2]pairedSlice
	for k := range 2 {
		if errs[k] != nil {
			b.Fatal(errs[k])
		}
	}
	for k := range 2 {
		got[k] = s[k].end(b, tcs[k], w[k])
	}
	return got
}

// sliceStart is an edge's counters when a slice began.
type sliceStart struct {
	e       *edgeProc
	masters []string
	before  metrics
	eval    int64
	cpu     float64
}

func beginSlice(b *testing.B, e *edgeProc, masters []string) *sliceStart {
	s := &sliceStart{e: e, masters: masters, before: mustScrape(b, e), eval: evalCalls(b, masters)}
	s.cpu = procCPUSeconds(b, e.Cmd.Process.Pid)
	return s
}

// end reads the edge's counters after wrk's run w and checks its responses.
func (s *sliceStart) end(b *testing.B, tc wrkCase, w wrkResult) pairedSlice {
	cpu := procCPUSeconds(b, s.e.Cmd.Process.Pid) - s.cpu
	after := mustScrape(b, s.e)
	delta := func(name string, match ...string) float64 {
		return sum(after, name, match...) - sum(s.before, name, match...)
	}
	checkWrkResponses(b, tc, w, delta)
	n := float64(w.requests)
	return pairedSlice{
		rps: n / (float64(w.durationUs) / 1e6), requests: n, cpuPerReq: cpu / n,
		scripts: delta(mStoreDecisions), evalsha: float64(evalCalls(b, s.masters) - s.eval), fallbacks: delta(mFallback),
	}
}

// pairStats summarizes per-pair ratios: median, quartiles, and a
// percentile-bootstrap 95% interval of the median.
type pairStats struct{ median, p25, p75, lo, hi float64 }

func summarizePairs(xs []float64) pairStats {
	s := slices.Sorted(slices.Values(xs))
	st := pairStats{median: quantile(s, 0.5), p25: quantile(s, 0.25), p75: quantile(s, 0.75)}
	const resamples = 2000
	rng := rand.New(rand.NewPCG(1, 2)) // fixed: the same pairs give the same interval
	meds := make([]float64, resamples)
	re := make([]float64, len(s))
	for i := range meds {
		for j := range re {
			re[j] = s[rng.IntN(len(s))]
		}
		slices.Sort(re)
		meds[i] = quantile(re, 0.5)
	}
	slices.Sort(meds)
	st.lo, st.hi = quantile(meds, 0.025), quantile(meds, 0.975)
	return st
}

// quantile of sorted s, linear between the closest ranks (R's type 7).
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	h := q * float64(len(s)-1)
	i := int(math.Floor(h))
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (h-float64(i))*(s[i+1]-s[i])
}

// loadAverage is the machine's 1-minute load average (/proc/loadavg).
func loadAverage(tb testing.TB) float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(data))
	x, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		tb.Fatalf("/proc/loadavg: %q", data)
	}
	return x
}

// ---------------------------------------------------------------------------
// Critical traffic under overload.

// BenchmarkCriticalP99Overload measures what the shedder promises critical
// traffic: its p99 latency under 3× overload against its p99 unloaded. An
// edge process runs 4 workers in front of an origin (in the benchmark
// process) that serves at most 4 requests at once, 20 ms each: 200 req/s.
// Unloaded, 50 critical req/s for 4 s; overloaded, 600 req/s for 8 s in a
// tier mix set by X-Priority from a trusted proxy (20% test, 40% read, 30%
// write, 10% critical), open loop from a Go load generator. The shedder
// settings are those of internal/edge's TestOverloadShedsLowTiersFirst (ramp
// start_after 1s, full_after 2s, queue 8 × 50 ms). p99 is over the
// successful critical requests; the loaded p99 is reported over the whole
// overload and over its last 5 s (after the ramp has reached its level).
// b.N is ignored: run it with -benchtime 1x.
func BenchmarkCriticalP99Overload(b *testing.B) {
	const (
		capacity = 4
		service  = 20 * time.Millisecond
		offered  = 600 // 3 × capacity / service
		overload = 8 * time.Second
		ramp     = 3 * time.Second
	)
	org := startBenchOrigin(b, capacity, service)
	shed := writeBenchFile(b, "shedder.json", `{"good": 0.7, "bad": 0.8, "start_after": "1s", "full_after": "2s",
		"smoothing": "200ms", "share_window": "1s", "queue_size": 8, "queue_timeout": "50ms"}`)
	e := startEdge(b, "--origin", org, "--workers", strconv.Itoa(capacity), "--shedder", shed,
		"--trusted-proxies", "127.0.0.1", "--log-level", "warn")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 1024}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()

	type result struct {
		tier    string
		code    int
		at      time.Duration // since the phase began
		latency time.Duration
	}
	send := func(tier string, at time.Duration) result {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.Addr+"/", nil)
		req.Header.Set("X-Priority", tier)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return result{tier: tier, at: at, latency: time.Since(start)}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return result{tier: tier, code: resp.StatusCode, at: at, latency: time.Since(start)}
	}
	run := func(rate int, d time.Duration, tiers []string) []result {
		return offerOpenLoop(rate, d, 1, nil, func(i, _ int, start time.Time) result {
			return send(tiers[i%len(tiers)], time.Since(start))
		})[0]
	}
	pct := func(rs []result, from time.Duration, p float64) (time.Duration, int, int) {
		var ls []time.Duration
		total := 0
		for _, x := range rs {
			if x.tier != "critical" || x.at < from {
				continue
			}
			total++
			if x.code == 200 {
				ls = append(ls, x.latency)
			}
		}
		if len(ls) == 0 {
			return 0, 0, total
		}
		slices.Sort(ls)
		return ls[min(len(ls)-1, int(float64(len(ls))*p))], len(ls), total
	}

	run(50, 500*time.Millisecond, []string{"critical"}) // connections
	unloaded := run(50, 4*time.Second, []string{"critical"})
	mix := []string{"test", "test", "read", "read", "read", "read", "write", "write", "write", "critical"}
	loaded := run(offered, overload, mix)

	u50, _, _ := pct(unloaded, 0, 0.50)
	u99, un, _ := pct(unloaded, 0, 0.99)
	l50, _, _ := pct(loaded, 0, 0.50)
	l99, ln, lt := pct(loaded, 0, 0.99)
	s99, sn, _ := pct(loaded, ramp, 0.99)
	codes := map[string]map[int]int{}
	for _, x := range loaded {
		if codes[x.tier] == nil {
			codes[x.tier] = map[int]int{}
		}
		codes[x.tier][x.code]++
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(u99), "unloaded-p99-ms")
	b.ReportMetric(ms(l99), "overload-p99-ms")
	b.ReportMetric(ms(s99), "overload-steady-p99-ms")
	b.ReportMetric(float64(l99)/float64(u99), "p99-ratio")
	b.ReportMetric(float64(s99)/float64(u99), "steady-p99-ratio")
	b.ReportMetric(float64(ln)/float64(max(lt, 1)), "critical-success")
	b.Logf("critical: unloaded p50 %.1f ms p99 %.1f ms (%d requests); 3× overload p50 %.1f ms p99 %.1f ms (%d of %d succeeded), after the ramp p99 %.1f ms (%d); ratio %.2f (steady %.2f)",
		ms(u50), ms(u99), un, ms(l50), ms(l99), ln, lt, ms(s99), sn, float64(l99)/float64(u99), float64(s99)/float64(u99))
	b.Logf("status codes under overload by tier: %v", codes)
	if ln < lt*99/100 {
		b.Errorf("critical success %d of %d under overload, want ≥ 99%%", ln, lt)
	}
}

// ---------------------------------------------------------------------------
// Helpers for benchmarks (main_test.go's take a *testing.T).

// startBenchOrigin serves 200 "ok\n" on a loopback port from the benchmark
// process; with capacity > 0 at most capacity requests are served at once,
// each taking service.
func startBenchOrigin(tb testing.TB, capacity int, service time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var slots chan struct{}
	if capacity > 0 {
		slots = make(chan struct{}, capacity)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if slots != nil {
			slots <- struct{}{}
			defer func() { <-slots }()
		}
		if service > 0 {
			time.Sleep(service) // kept: the origin's service time is the subject
		}
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("ok\n")
	}}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func writeBenchFile(tb testing.TB, name, content string) string {
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func mustScrape(tb testing.TB, e *edgeProc) metrics {
	s, err := scrapeErr(e)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// procCPUSeconds is utime+stime of pid (and of its reaped children, which
// the edge has none of), from /proc/<pid>/stat.
func procCPUSeconds(tb testing.TB, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseFloat(f[14-3], 64)
	stime, err2 := strconv.ParseFloat(f[15-3], 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("parsing /proc/%d/stat: %q", pid, s)
	}
	return (utime + stime) / clockTicks(tb)
}

// machineBusySeconds is the CPU time every core spent busy (not idle or
// waiting for I/O) since boot, from /proc/stat.
func machineBusySeconds(tb testing.TB) float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		tb.Fatalf("/proc/stat: %q", line)
	}
	busy := 0.0
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("/proc/stat: %q", line)
		}
		busy += x
	}
	return busy / clockTicks(tb)
}

var clockTicksOnce = sync.OnceValues(func() (float64, error) {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
})

func clockTicks(tb testing.TB) float64 {
	hz, err := clockTicksOnce()
	if err != nil || hz <= 0 {
		tb.Fatalf("getconf CLK_TCK: %v", err)
	}
	return hz
}

// evalCalls sums EVALSHA calls (INFO commandstats) over addrs.
func evalCalls(tb testing.TB, addrs []string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var total int64
	for _, a := range addrs {
		calls, _, err := commandStats(ctx, a, "evalsha")
		if err != nil {
			tb.Fatal(err)
		}
		total += calls
	}
	return total
}

// redisCPU sums used_cpu_user and used_cpu_sys (INFO cpu) over addrs.
func redisCPU(tb testing.TB, addrs []string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	total := 0.0
	for _, a := range addrs {
		err := onNode(ctx, a, func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "cpu").Result()
			if err != nil {
				return err
			}
			for line := range strings.Lines(info) {
				k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
				if k == "used_cpu_user" || k == "used_cpu_sys" {
					x, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return err
					}
					total += x
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return total
}

// profileEdge takes a CPU profile of the edge during the measured run when
// EDGE_BENCH_PPROF_DIR is set; the channel closes when it is written.
func profileEdge(tb testing.TB, e *edgeProc, name string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("EDGE_BENCH_PPROF_DIR")
	if dir == "" {
		close(done)
		return done
	}
	secs := max(1, int((d-time.Second)/time.Second))
	go func() {
		defer close(done)
		c := &http.Client{Timeout: time.Duration(secs+10) * time.Second}
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.Admin, secs), nil)
		if err != nil {
			tb.Errorf("profile: %v", err)
			return
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := c.Do(req)
		if err != nil {
			tb.Errorf("profile: %v", err)
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pprof"), data, 0o644)
		}
		if err != nil {
			tb.Errorf("profile: %v", err)
		}
	}()
	return done
}

func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second {
		tb.Fatalf("%s=%q: want a duration of at least 1s", name, v)
	}
	return d
}

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 {
		tb.Fatalf("%s=%q: want an integer ≥ 2", name, v)
	}
	return n
}

// procIOCounts are a process's read and write system calls, from
// /proc/<pid>/io (syscr, syscw).
type procIOCounts struct{ syscr, syscw int64 }

func procIO(tb testing.TB, pid int) procIOCounts {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		tb.Fatal(err)
	}
	var c procIOCounts
	found := 0
	for line := range strings.Lines(string(data)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		var p *int64
		switch k {
		case "syscr":
			p = &c.syscr
		case "syscw":
			p = &c.syscw
		default:
			continue
		}
		if *p, err = strconv.ParseInt(v, 10, 64); err != nil {
			tb.Fatalf("parsing /proc/%d/io: %q", pid, line)
		}
		found++
	}
	if found != 2 {
		tb.Fatalf("/proc/%d/io has no syscr/syscw:\n%s", pid, data)
	}
	return c
}

// nodeCounts are one Redis node's CPU seconds and EVALSHA calls.
type nodeCounts struct {
	cpu     float64
	evalsha int64
}

// perNode reads every node's CPU (INFO cpu) and EVALSHA calls.
func perNode(tb testing.TB, addrs []string) map[string]nodeCounts {
	out := make(map[string]nodeCounts, len(addrs))
	for _, a := range addrs {
		out[a] = nodeCounts{cpu: redisCPU(tb, []string{a}), evalsha: evalCalls(tb, []string{a})}
	}
	return out
}

// openLoopRun is what a fixed-rate run gave.
type openLoopRun struct {
	p50, p99 float64 // ms, from when each request was due
	sentRate float64 // req/s actually scheduled over the run
	failed   float64 // fraction of requests that failed or were not 200
}

// openLoopPair loads off and on, one after the other, at rate for d each
// (each after a 1 s warm-up at the same rate).
func openLoopPair(tb testing.TB, off, on *edgeProc, rate float64, d time.Duration) (openLoopRun, openLoopRun) {
	var runs [2]openLoopRun
	for i, e := range []*edgeProc{off, on} {
		if _, err := openLoop(e.Addr, rate, time.Second); err != nil {
			tb.Fatal(err)
		}
		r, err := openLoop(e.Addr, rate, d)
		if err != nil {
			tb.Fatal(err)
		}
		runs[i] = r
	}
	return runs[0], runs[1]
}

// openLoop sends GET / to addr at a fixed rate for d, whatever the answers
// take (open loop: a slow answer does not delay the next request), each with
// a fresh X-Forwarded-For, and returns the latency percentiles counted from
// when each request was due, so that the generator's own delays count
// against the measure rather than hide a stall. Failed requests and
// statuses other than 200 (the shedder answers 503 when the machine stalls)
// are counted in failed and their latencies kept; a run that could not keep
// the rate within 5% is an error.
func openLoop(addr string, rate float64, d time.Duration) (openLoopRun, error) {
	if rate <= 0 {
		return openLoopRun{}, fmt.Errorf("open loop: rate %.1f", rate)
	}
	c := &fasthttp.HostClient{Addr: addr, MaxConns: 4096, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxIdleConnDuration: time.Minute}
	defer c.CloseIdleConnections()
	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var firstErr firstError
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w) // kept: an open loop sends each request when it is due
		}
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/")
			req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", 200+i>>16%50, i>>8%256, i%256))
			err := c.Do(req, resp)
			lat[i] = time.Since(at)
			if err == nil && resp.StatusCode() != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode())
			}
			if err != nil {
				failed.Add(1)
				firstErr.set(err)
			}
		})
	}
	sched := time.Since(start)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		log.Printf("open loop at %.0f req/s: %d of %d requests failed, first: %v", rate, f, n, firstErr.get())
	}
	sent := float64(n) / max(sched.Seconds(), d.Seconds()-interval.Seconds())
	if sent < rate*0.95 {
		return openLoopRun{}, fmt.Errorf("open loop: scheduled %.0f req/s, want %.0f", sent, rate)
	}
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[min(n-1, int(float64(n)*q))]) / 1e6 }
	return openLoopRun{p50: ms(0.50), p99: ms(0.99), sentRate: sent, failed: float64(failed.Load()) / float64(n)}, nil
}

// ---------------------------------------------------------------------------
// Redis CPU of the scripts against a plain counter.

// BenchmarkRedisScriptCost measures what each algorithm's script costs the
// Redis server per decision, against the cheapest counter a limiter could
// keep: INCRBY and EXPIRE of one key, sent together. On a standalone
// redis-server of its own, 10,000 keys named as production names them
// (eg:{bench:<hex>}:<suffix>; the counter's keys have the same length),
// admitting limits:
//
//	<algorithm>/single   32 goroutines, one decision per round trip: the
//	                     script through RedisStore.Take over a plain client
//	                     (a lone EVALSHA), the counter as a 2-command pipeline
//	<algorithm>/batched  the same goroutines, 16 decisions per round trip:
//	                     a Take of 16 requests (one call of the batch script,
//	                     as a lane at the edge sends its queue), against a
//	                     pipeline of 16 INCRBY+EXPIRE pairs
//
// Script and counter alternate in 1 s slices, three of each, so both see the
// same machine; Redis CPU is used_cpu_user + used_cpu_sys (INFO cpu) over
// each slice. empty-script is the floor: a script that returns at once,
// called with a fixed window's key and arguments, one EVALSHA per decision
// (16 in a pipeline for batched). Concurrency's decisions include their release (a second
// script call), as at the edge. Reported: Redis µs per decision for both and
// their ratio. b.N is ignored: run it with -benchtime 1x.
func BenchmarkRedisScriptCost(b *testing.B) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64, MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	st, err := limiter.NewRedisStore(limiter.Conn(c), "")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Load(ctx); err != nil {
		b.Fatal(err)
	}
	const (
		keys       = 10_000
		goroutines = 32
		slice      = time.Second
		rounds     = 3
	)
	// The floor: a script that does nothing, called with a fixed window's
	// key and arguments: what EVALSHA itself costs before any work.
	floorSHA, err := c.ScriptLoad(ctx, "return 0").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, style := range []struct {
		name  string
		batch int
	}{{"single", 1}, {"batched", 16}} {
		for _, alg := range append(limit.All(), 0) {
			name := alg.String()
			if alg == 0 {
				name, alg = "empty-script", limit.FixedWindow
			}
			b.Run(name+"/"+style.name, func(b *testing.B) {
				load := newScriptCostLoad(c, st, floorSHA, alg, style.batch, keys)
				run := load.script
				if name == "empty-script" {
					run = load.empty
				}
				var cpu, decisions [2]float64
				for range rounds {
					for k, f := range []func(int) error{run, load.plain} {
						secs, n, err := driveRedis(b, srv.Addr, goroutines, slice, style.batch, f)
						if err != nil {
							b.Fatal(err)
						}
						cpu[k] += secs
						decisions[k] += n
					}
				}
				us := func(k int) float64 { return cpu[k] / decisions[k] * 1e6 }
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(us(0), "script-redis-µs/decision")
				b.ReportMetric(us(1), "incr-expire-redis-µs/decision")
				b.ReportMetric(us(0)/us(1), "script/incr-expire")
				b.ReportMetric(decisions[0]/(rounds*slice.Seconds()), "script-decisions/s")
			})
		}
	}
}

// scriptCostLoad is one case of BenchmarkRedisScriptCost: keys limits of
// one algorithm, the counters beside them, and the three workloads, each a
// call of batch decisions starting at key i.
type scriptCostLoad struct {
	c        *redis.Client
	st       *limiter.RedisStore
	floorSHA string
	batch    int
	limits   []limiter.Limit
	counters []string
	held     bool
}

func newScriptCostLoad(c *redis.Client, st *limiter.RedisStore, floorSHA string, alg limit.Algorithm, batch, keys int) *scriptCostLoad {
	lim := limiter.Limit{Algorithm: alg, Limit: 1_000_000, Window: time.Second}
	if sp := alg.Spec(); sp.MaxLimit > 0 {
		lim.Limit = sp.MaxLimit
	}
	l := &scriptCostLoad{c: c, st: st, floorSHA: floorSHA, batch: batch, held: alg.Spec().Held,
		limits: make([]limiter.Limit, keys), counters: make([]string, keys)}
	for i := range l.limits {
		l.limits[i] = lim
		l.limits[i].Key = fmt.Sprintf("bench:%016x", uint64(i)*0x9e3779b97f4a7c15)
		l.counters[i] = st.Keys(l.limits[i])[0] + "c" // one byte longer than the script's
	}
	return l
}

// empty calls the script that does nothing with a fixed window's keys and
// arguments: the floor.
func (l *scriptCostLoad) empty(i int) error {
	ctx := context.Background()
	p := l.c.Pipeline()
	for j := range l.batch {
		lim := l.limits[(i+j)%len(l.limits)]
		p.EvalSha(ctx, l.floorSHA, l.st.Keys(lim), "take", 0, lim.Limit, lim.Window.Microseconds(), 0, 1, 1)
	}
	_, err := p.Exec(ctx)
	return err
}

// script takes one unit of each limit through the store, and releases it
// again on a held (concurrency) limit, as the edge does.
func (l *scriptCostLoad) script(i int) error {
	ctx := context.Background()
	reqs := make([]limiter.Request, l.batch)
	for j := range reqs {
		reqs[j] = limiter.Request{Limit: l.limits[(i+j)%len(l.limits)], Cost: 1}
	}
	ds, err := l.st.Take(ctx, reqs)
	if err != nil {
		return err
	}
	var leases []limiter.Lease
	for _, d := range ds {
		if !d.Allowed {
			return fmt.Errorf("denied: %+v", d)
		}
		leases = append(leases, d.Lease)
	}
	if l.held {
		return l.st.Refund(ctx, leases)
	}
	return nil
}

// plain is the baseline: INCRBY and EXPIRE on a counter beside each key.
func (l *scriptCostLoad) plain(i int) error {
	ctx := context.Background()
	p := l.c.Pipeline()
	for j := range l.batch {
		k := l.counters[(i+j)%len(l.counters)]
		p.IncrBy(ctx, k, 1)
		p.Expire(ctx, k, time.Second)
	}
	_, err := p.Exec(ctx)
	return err
}

// driveRedis runs f from goroutines for d (each call makes per decisions,
// the i-th from key i) and returns the Redis CPU seconds spent meanwhile
// and the decisions made.
func driveRedis(tb testing.TB, addr string, goroutines int, d time.Duration, per int, f func(i int) error) (float64, float64, error) {
	var next, made atomic.Int64
	var firstErr firstError
	before := redisCPU(tb, []string{addr})
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				i := int(next.Add(int64(per)))
				if err := f(i); err != nil {
					firstErr.set(err)
					return
				}
				made.Add(int64(per))
			}
		})
	}
	wg.Wait()
	if err := firstErr.get(); err != nil {
		return 0, 0, err
	}
	return redisCPU(tb, []string{addr}) - before, float64(made.Load()), nil
}

// firstError keeps the first error of many goroutines.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
