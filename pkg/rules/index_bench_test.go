package rules

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// hostRulesYAML is a CDN-shaped document: one rule per customer host
// siteN.example.com, each on a path prefix, plus two rules for every host.
func hostRulesYAML(n int) []byte {
	var b strings.Builder
	b.Grow(n * 130)
	b.WriteString("version: 1\nrules:\n")
	b.WriteString("  - {id: per-ip, key: [ip], algorithm: sliding_window, limit: 1000, window: 1m}\n")
	b.WriteString("  - {id: login, match: {path_prefix: [/login], methods: [POST]}, key: [ip], algorithm: sliding_log, limit: 5, window: 1m}\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {id: site%d, match: {hosts: [site%d.example.com], path_prefix: [/api]}, key: [ip, host], algorithm: token_bucket, limit: 100, window: 1s}\n", i, i)
	}
	return []byte(b.String())
}

// hostRequest is a request that matches the host rule of site n/2 and the
// per-ip rule: three rules apply at any size.
func hostRequest(n int) *Request {
	return &Request{
		Host:     fmt.Sprintf("site%d.example.com", n/2),
		Method:   "GET",
		Path:     "/api/users/42",
		ClientIP: netip.MustParseAddr("203.0.113.7"),
	}
}

var hostRuleCounts = []int{10, 1_000, 100_000}

func compileHostRules(b *testing.B, n int) *Snapshot {
	b.Helper()
	doc, err := Parse(hostRulesYAML(n))
	if err != nil {
		b.Fatal(err)
	}
	s, err := Compile(doc)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkMatchHostRules is Match with 10, 1,000 and 100,000 host rules,
// the same request shape each time (two rules apply).
func BenchmarkMatchHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			s := compileHostRules(b, n)
			req := hostRequest(n)
			dst := make([]Match, 0, 16)
			if got := len(s.Match(req, dst)); got != 2 {
				b.Fatalf("matched %d rules, want 2", got)
			}
			b.ReportAllocs()
			for b.Loop() {
				dst = s.Match(req, dst[:0])
			}
		})
	}
}

// BenchmarkMatchScanHostRules is the plain scan on the same rules, for the
// ratio (100,000 is left out: a scan costs over a millisecond there).
func BenchmarkMatchScanHostRules(b *testing.B) {
	for _, n := range hostRuleCounts[:2] {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			s := compileHostRules(b, n)
			req := hostRequest(n)
			dst := make([]Match, 0, 16)
			b.ReportAllocs()
			for b.Loop() {
				dst = s.matchScan(req, dst[:0])
			}
		})
	}
}

// BenchmarkCompileHostRules is what a reload costs: parse, validate,
// compile (the version hash and the index included). It reports the heap a
// compiled rule keeps, measured after a GC, as B/rule.
func BenchmarkCompileHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			data := hostRulesYAML(n)
			b.SetBytes(int64(len(data)))
			cpu0 := cpuTime(b)
			for b.Loop() {
				forgetPieces() // a first load
				doc, err := Parse(data)
				if err != nil {
					b.Fatal(err)
				}
				if _, err = Compile(doc); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			// The heap a snapshot keeps: live heap with it, then without it,
			// each after a full collection, so garbage left by the loads
			// and whatever else the heap held cancel out.
			doc, err := Parse(data)
			if err != nil {
				b.Fatal(err)
			}
			s, err := Compile(doc)
			if err != nil {
				b.Fatal(err)
			}
			doc = nil
			var with, without runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&with)
			rules := len(s.rules)
			s = nil
			runtime.GC()
			runtime.ReadMemStats(&without)
			b.ReportMetric(float64(int64(with.HeapAlloc)-int64(without.HeapAlloc))/float64(rules), "B/rule")
			_, _ = doc, s
		})
	}
}

// BenchmarkLoadHostRules is what the edge does with a rules file: Load,
// which is BenchmarkCompileHostRules without Compile's copy and second
// validation of the parsed document.
func BenchmarkLoadHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			data := hostRulesYAML(n)
			b.SetBytes(int64(len(data)))
			cpu0 := cpuTime(b)
			for b.Loop() {
				forgetPieces() // a first load
				if _, err := Load(data); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			// The heap the remembered pieces keep (seen), per rule.
			var with, without runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&with)
			forgetPieces()
			runtime.GC()
			runtime.ReadMemStats(&without)
			b.ReportMetric(float64(int64(with.HeapAlloc)-int64(without.HeapAlloc))/float64(n+2), "remembered-B/rule")
		})
	}
}

// BenchmarkReloadHostRules is what an edge does with a new rule set from
// Consul: Effective (parse, merge with no region document, compile), then
// the merged document written as YAML for the rules cache. "first" is a
// document the edge has not parsed before; "one-changed" is a document one
// rule away from the last one parsed (a push of one rule, each load
// alternating two such documents).
func BenchmarkReloadHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		for _, tc := range []struct {
			name  string
			first bool
		}{{"first", true}, {"one-changed", false}} {
			b.Run(fmt.Sprintf("rules=%d/%s", n, tc.name), func(b *testing.B) {
				texts := [2][]byte{hostRulesYAML(n), oneRuleChanged(b, hostRulesYAML(n), n/2)}
				forgetPieces()
				reload(b, texts[1])
				cpu0 := cpuTime(b)
				for i := 0; b.Loop(); i++ {
					if tc.first {
						forgetPieces()
					}
					reload(b, texts[i%2])
				}
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

func reload(b *testing.B, data []byte) {
	_, merged, err := Effective(data, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := Marshal(merged); err != nil {
		b.Fatal(err)
	}
}

// oneRuleChanged is hostRulesYAML(n) with the limit of rule site<k> raised.
func oneRuleChanged(tb testing.TB, data []byte, k int) []byte {
	line := fmt.Sprintf("{id: site%d, ", k)
	i := bytes.Index(data, []byte(line))
	j := -1
	if i >= 0 {
		j = bytes.Index(data[i:], []byte("limit: 100,"))
	}
	if j < 0 {
		tb.Fatalf("no rule site%d", k)
	}
	return slices.Concat(data[:i+j], []byte("limit: 101,"), data[i+j+len("limit: 100,"):])
}

// BenchmarkMarshalHostRules writes a merged rule set as YAML (the edge's
// rules cache, regionctl rules get) with Marshal and with yaml.v3's
// encoder, which Marshal replaces where it can.
func BenchmarkMarshalHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		doc, err := Merge(compileHostRulesDoc(b, n), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("rules=%d/Marshal", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := Marshal(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("rules=%d/yaml.v3", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := yaml.Marshal(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func compileHostRulesDoc(b *testing.B, n int) *Document {
	b.Helper()
	doc, err := Parse(hostRulesYAML(n))
	if err != nil {
		b.Fatal(err)
	}
	return doc
}

// BenchmarkMatchDuringReload measures what a reload costs the requests
// running meanwhile: one goroutine matches against the current snapshot
// (an atomic pointer, as the edge holds it) while another parses and
// compiles 100,000 host rules and swaps them in. It reports the p50 and p99
// of Match before the reload and while it runs; run it with -benchtime 1x.
func BenchmarkMatchDuringReload(b *testing.B) {
	const n = 100_000
	data := hostRulesYAML(n)
	var current atomic.Pointer[Snapshot]
	current.Store(compileHostRules(b, n))
	req := hostRequest(n)
	dst := make([]Match, 0, 16)
	measure := func(until func() bool) []time.Duration {
		var lat []time.Duration
		for !until() {
			t0 := time.Now()
			dst = current.Load().Match(req, dst[:0])
			lat = append(lat, time.Since(t0))
		}
		return lat
	}
	for b.Loop() {
		start := time.Now()
		idle := measure(func() bool { return time.Since(start) > 500*time.Millisecond })
		done := make(chan struct{})
		var reloads atomic.Int64
		go func() {
			defer close(done)
			doc, err := Parse(data)
			if err != nil {
				b.Error(err)
				return
			}
			s, err := Compile(doc)
			if err != nil {
				b.Error(err)
				return
			}
			current.Store(s)
			reloads.Add(1)
		}()
		during := measure(func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
		if reloads.Load() != 1 || len(during) == 0 {
			b.Fatal("no reload happened")
		}
		b.ReportMetric(float64(pct(idle, 50)), "idle-p50-ns")
		b.ReportMetric(float64(pct(idle, 99)), "idle-p99-ns")
		b.ReportMetric(float64(pct(during, 50)), "reload-p50-ns")
		b.ReportMetric(float64(pct(during, 99)), "reload-p99-ns")
		b.ReportMetric(float64(pct(during, 100)), "reload-max-ns")
	}
}

// cpuTime is the CPU time (user and system, every thread, the garbage
// collector's included) the process has used: on a loaded machine it says
// what a load costs where the wall time mostly says how busy the machine is.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pct(lat []time.Duration, p int) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i]
}
