//go:build unix

package limiter_test

// Benchmarks of the stores against the real deployments TestMain starts
// (standalone Redis and a 3-master Cluster), of the memory store and of
// Decide, next to redis-benchmark running the very same scripts against the
// very same servers, plus the per-key Redis memory test. BENCHMARKS.md has
// the figures and the commands that produced them.
//
// One op is one decision in every store benchmark, however many requests a
// Take carries, so ns/op, B/op and allocs/op are per decision and two styles
// compare directly. Each benchmark also reports decisions/s (b.N over wall
// time), allocs/decision (runtime.MemStats mallocs over b.N, the counter
// -benchmem reads, spelled out because the issue asks for it) and the CPU
// time per decision of the Redis servers (INFO cpu, every node, replicas
// included) and of the client (this process, or redis-benchmark): on a small
// shared machine those costs say more, and vary less, than rates.
//
// The file needs getrusage, hence unix; the servers it talks to need it too.

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/csv"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/lua"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

const (
	// benchKeys is how many distinct keys an admitting benchmark spreads
	// over, so that Redis works on a realistic keyspace, not one hot key.
	benchKeys = 10_000
	// benchDeniedKeys are pre-exhausted keys for the denied path.
	benchDeniedKeys = 1_000
	// benchBatch is the number of requests (on distinct keys) per Take in
	// the pipelined style.
	benchBatch = 16
	// benchParallelism goroutines per GOMAXPROCS call the store at once.
	benchParallelism = 16
	// benchCeilingClients is redis-benchmark's -c.
	benchCeilingClients = 50
)

var benchAlgorithms = []limiter.Algorithm{
	limit.SlidingLog, limit.SlidingWindow, limit.TokenBucket, limit.FixedWindow, limit.Concurrency,
}

// benchAlgName is the Go constant's name, as in the benchmark names.
func benchAlgName(a limiter.Algorithm) string {
	return map[limiter.Algorithm]string{
		limit.SlidingLog:    "SlidingLog",
		limit.SlidingWindow: "SlidingWindow",
		limit.TokenBucket:   "TokenBucket",
		limit.FixedWindow:   "FixedWindow",
		limit.Concurrency:   "Concurrency",
	}[a]
}

// admitting is the shape of an admitting benchmark's limits: a quota far
// above what any key receives, so every decision admits. The one-second
// window keeps the sliding log's and the concurrency set's members (and so
// Redis's memory) bounded over a long run; the work per call does not depend
// on the window.
// The algorithms that keep one member per unit take their largest valid
// quota.
func admitting(alg limiter.Algorithm) limiter.Limit {
	l := limiter.Limit{Algorithm: alg, Limit: 1_000_000, Window: time.Second}
	if m := alg.Spec().MaxLimit; m > 0 && l.Limit > m {
		l.Limit = m
	}
	return l
}

// denying is the shape of a denied-path benchmark's limits: a quota of one
// per day, exhausted before the timed loop, so every decision is a denial
// that writes nothing.
func denying(alg limiter.Algorithm) limiter.Limit {
	return limiter.Limit{Algorithm: alg, Limit: 1, Window: 24 * time.Hour}
}

var (
	benchPrefixMu sync.Mutex
	benchPrefixes = map[string]string{}
)

// benchPrefix is a short key prefix, stable for one benchmark name within the
// process (the b.N ramp and -count reuse the keys a first run set up) and new
// in each process. It is short on purpose: testenv.KeyPrefix's long prefixes
// would make Redis hash and store longer keys than production's.
func benchPrefix(b *testing.B) string {
	benchPrefixMu.Lock()
	defer benchPrefixMu.Unlock()
	p, ok := benchPrefixes[b.Name()]
	if !ok {
		p = fmt.Sprintf("b%06x:", rand.Uint32()&0xffffff)
		benchPrefixes[b.Name()] = p
	}
	return p
}

// benchLimits returns n limits shaped like shape, one per key, with keys as
// long as production's (a rule name and a 64-bit descriptor hash).
func benchLimits(b *testing.B, shape limiter.Limit, n int) []limiter.Limit {
	p := benchPrefix(b)
	out := make([]limiter.Limit, n)
	for i := range out {
		out[i] = shape
		out[i].Key = fmt.Sprintf("%s%016x", p, uint64(i)*0x9e3779b97f4a7c15)
	}
	return out
}

// exhaust takes every limit's whole quota, so that later takes are denied.
// Already exhausted keys (a previous run of the same benchmark) stay so.
func exhaust(b *testing.B, st limiter.Store, limits []limiter.Limit) {
	reqs := make([]limiter.Request, 0, 500)
	flush := func() {
		_, err := st.Take(context.Background(), reqs)
		require.NoError(b, err)
		reqs = reqs[:0]
	}
	for _, l := range limits {
		reqs = append(reqs, limiter.Request{Limit: l, Cost: l.Capacity()})
		if len(reqs) == cap(reqs) {
			flush()
		}
	}
	if len(reqs) > 0 {
		flush()
	}
}

// benchTakes runs b.N decisions on limits from benchParallelism×GOMAXPROCS
// goroutines, batch requests on distinct keys per Take. Keys are used round
// robin from a shared counter. Concurrency slots are released (Refund of the
// lease, a second round trip) right after each Take, as a proxy releases them
// when a request ends; otherwise the sets would fill. Every decision must have
// the wanted outcome: a benchmark that silently measured the other path would
// be worse than none.
func benchTakes(b *testing.B, st limiter.Store, nodes []string, limits []limiter.Limit, batch int, wantAllowed bool) float64 {
	var next atomic.Uint64
	var wrong atomic.Int64
	c := context.Background()
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu := startCPU(b, nodes)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		reqs := make([]limiter.Request, 0, batch)
		leases := make([]limiter.Lease, 0, batch)
		for {
			reqs = reqs[:0]
			for len(reqs) < batch && pb.Next() {
				i := next.Add(1) % uint64(len(limits))
				reqs = append(reqs, limiter.Request{Limit: limits[i], Cost: 1})
			}
			if len(reqs) == 0 {
				return
			}
			ds, err := st.Take(c, reqs)
			if err != nil {
				b.Error(err)
				return
			}
			leases = leases[:0]
			for _, d := range ds {
				if d.Allowed != wantAllowed {
					wrong.Add(1)
				}
				if d.Lease.Limit.Algorithm == limit.Concurrency && d.Admitted > 0 {
					leases = append(leases, d.Lease)
				}
			}
			if len(leases) > 0 {
				if err := st.Refund(c, leases); err != nil {
					b.Error(err)
					return
				}
			}
		}
	})
	b.StopTimer()
	cpu.report(b, selfCPU()-cpu.self, "decision")
	runtime.ReadMemStats(&m1)
	// A denied key admits again when its day-long fixed window turns over:
	// at most once per key.
	if w := wrong.Load(); wantAllowed && w > 0 || !wantAllowed && w > int64(len(limits))+int64(b.N/100) {
		b.Fatalf("%d of %d decisions had Allowed=%v", w, b.N, !wantAllowed)
	}
	rate := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "decisions/s")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(b.N), "allocs/decision")
	return rate
}

// benchStyle is how a benchmark calls the store.
type benchStyle struct {
	name   string
	batch  int  // requests per Take
	denied bool // exhausted keys: the denial path
}

var benchStyles = []benchStyle{
	{"single", 1, false},
	{"pipelined", benchBatch, false},
	{"single-denied", 1, true},
	{"pipelined-denied", benchBatch, true},
}

func runStyle(b *testing.B, st limiter.Store, nodes []string, alg limiter.Algorithm, style benchStyle) float64 {
	if style.denied {
		limits := benchLimits(b, denying(alg), benchDeniedKeys)
		exhaust(b, st, limits)
		return benchTakes(b, st, nodes, limits, style.batch, false)
	}
	return benchTakes(b, st, nodes, benchLimits(b, admitting(alg), benchKeys), style.batch, true)
}

// nodesOf lists every server of a deployment, replicas included: they all
// share the machine's cores with the client.
func nodesOf(mode limiter.Mode) []string {
	if mode == limiter.ModeCluster {
		return clusterSrv().Addrs()
	}
	return []string{standaloneSrv().Addr}
}

// benchCPU measures the CPU time that a deployment's Redis servers and the
// client spend over a benchmark's timed loop. Per decision, these costs are
// steadier than rates on a shared machine, and say where the time goes.
type benchCPU struct {
	nodes []*redis.Client
	redis float64       // the servers' used_cpu_user + used_cpu_sys, seconds
	self  time.Duration // this process's user + system time
}

func startCPU(b *testing.B, addrs []string) *benchCPU {
	m := &benchCPU{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 1})
		b.Cleanup(func() { _ = c.Close() })
		m.nodes = append(m.nodes, c)
	}
	m.redis = m.redisCPU(b)
	m.self = selfCPU()
	return m
}

func (m *benchCPU) redisCPU(b *testing.B) float64 {
	var sum float64
	for _, c := range m.nodes {
		info, err := c.Info(context.Background(), "cpu").Result()
		require.NoError(b, err)
		for line := range strings.Lines(info) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_sys" || k == "used_cpu_user" {
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(b, err, line)
				sum += f
			}
		}
	}
	return sum
}

// report adds the CPU time per op (per unit: decision or request) of the
// Redis servers, if any, and of the client, which spent client in the timed
// loop.
func (m *benchCPU) report(b *testing.B, client time.Duration, unit string) {
	if len(m.nodes) > 0 {
		b.ReportMetric((m.redisCPU(b)-m.redis)*1e6/float64(b.N), "redis-µs/"+unit)
	}
	b.ReportMetric(float64(client.Microseconds())/float64(b.N), "client-µs/"+unit)
}

// selfCPU is the user and system time of this process so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ceilings holds the last redis-benchmark rate per mode/algorithm/pipeline
// depth, for the Go benchmarks that run after it to report their fraction.
var (
	ceilingMu sync.Mutex
	ceilings  = map[string]float64{}
)

// BenchmarkRedisTake measures RedisStore.Take against standalone Redis and the
// Cluster, for every algorithm, next to redis-benchmark's ceiling for the same
// script on the same server, measured just before:
//
//	<mode>/<algorithm>/redis-benchmark       EVALSHA, -c 50, no pipelining
//	<mode>/<algorithm>/redis-benchmark-P16   EVALSHA, -c 50, -P 16
//	<mode>/<algorithm>/single                one request per Take
//	<mode>/<algorithm>/pipelined             16 requests (distinct keys) per Take
//	<mode>/<algorithm>/single-denied         the same on exhausted keys
//	<mode>/<algorithm>/pipelined-denied
//
// single and pipelined report fraction-of-ceiling: their decisions/s over the
// redis-benchmark rate without and with -P 16.
func BenchmarkRedisTake(b *testing.B) {
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		b.Run(string(mode), func(b *testing.B) {
			client := client(mode)
			st := redisStore(b, client)
			require.NoError(b, st.Load(context.Background()))
			for _, alg := range benchAlgorithms {
				b.Run(benchAlgName(alg), func(b *testing.B) {
					for _, p := range []int{1, benchBatch} {
						name := "redis-benchmark"
						if p > 1 {
							name += "-P" + strconv.Itoa(p)
						}
						b.Run(name, func(b *testing.B) {
							rate := benchRedisBenchmark(b, mode, alg, p)
							ceilingMu.Lock()
							ceilings[fmt.Sprint(mode, alg, p)] = rate
							ceilingMu.Unlock()
						})
					}
					for _, style := range benchStyles {
						b.Run(style.name, func(b *testing.B) {
							rate := runStyle(b, st, nodesOf(mode), alg, style)
							ceilingMu.Lock()
							ceiling, ok := ceilings[fmt.Sprint(mode, alg, style.batch)]
							ceilingMu.Unlock()
							if ok && !style.denied {
								b.ReportMetric(rate/ceiling, "fraction-of-ceiling")
							}
						})
					}
				})
			}
		})
	}
}

// BenchmarkMemoryTake is BenchmarkRedisTake's styles over a MemoryStore.
func BenchmarkMemoryTake(b *testing.B) {
	for _, alg := range benchAlgorithms {
		b.Run(benchAlgName(alg), func(b *testing.B) {
			st := limiter.NewMemoryStore()
			for _, style := range benchStyles {
				b.Run(style.name, func(b *testing.B) { runStyle(b, st, nil, alg, style) })
			}
		})
	}
}

// BenchmarkDecide decides requests that carry two limits, as a proxy does: a
// fixed window per client key and a token bucket per tenant (100 tenants).
// allowed: both admit. denied: the tenant's bucket is exhausted, so the
// client's window admits and Decide refunds it in a second round trip. One op
// is one request (two limits); requests/s is b.N over wall time.
func BenchmarkDecide(b *testing.B) {
	stores := []struct {
		name  string
		st    func(b *testing.B) limiter.Store
		nodes []string
	}{
		{"memory", func(*testing.B) limiter.Store { return limiter.NewMemoryStore() }, nil},
		{"standalone", func(b *testing.B) limiter.Store { return redisStore(b, client(limiter.ModeStandalone)) }, nodesOf(limiter.ModeStandalone)},
		{"cluster", func(b *testing.B) limiter.Store { return redisStore(b, client(limiter.ModeCluster)) }, nodesOf(limiter.ModeCluster)},
	}
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			st := s.st(b)
			for _, denied := range []bool{false, true} {
				name := "allowed"
				if denied {
					name = "denied"
				}
				b.Run(name, func(b *testing.B) {
					clientLimits := benchLimits(b, admitting(limit.FixedWindow), benchKeys)
					tenant := limiter.Limit{Algorithm: limit.TokenBucket, Limit: 1_000_000, Window: time.Second} // the largest valid rate
					if denied {
						tenant = limiter.Limit{Algorithm: limit.TokenBucket, Limit: 1, Window: 24 * time.Hour}
					}
					tenants := benchLimits(b, tenant, 100)
					for i := range tenants {
						tenants[i].Key += ":t"
					}
					if denied {
						exhaust(b, st, tenants)
					}
					var next atomic.Uint64
					var wrong atomic.Int64
					lim, err := limiter.New(st, limiter.Config{Timeout: time.Minute, FailMode: limiter.FailClosed}, nil, nil)
					require.NoError(b, err)
					b.SetParallelism(benchParallelism)
					b.ReportAllocs()
					cpu := startCPU(b, s.nodes)
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						c := context.Background()
						for pb.Next() {
							i := next.Add(1)
							res, err := lim.Decide(c, []limiter.Check{
								{Limit: clientLimits[i%uint64(len(clientLimits))], Cost: 1},
								{Limit: tenants[i%uint64(len(tenants))], Cost: 1},
							})
							if err != nil {
								b.Error(err)
								return
							}
							if res.Allowed == denied {
								wrong.Add(1)
							}
						}
					})
					b.StopTimer()
					cpu.report(b, selfCPU()-cpu.self, "request")
					if w := wrong.Load(); !denied && w > 0 || denied && w > int64(len(tenants))+int64(b.N/100) {
						b.Fatalf("%d of %d requests had Allowed=%v", w, b.N, denied)
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
				})
			}
		})
	}
}

// benchScriptNames maps algorithms to package lua's script names.
var benchScriptNames = map[limiter.Algorithm]string{
	limit.SlidingLog:    lua.SlidingLog,
	limit.SlidingWindow: lua.SlidingWindow,
	limit.TokenBucket:   lua.GCRA,
	limit.FixedWindow:   lua.FixedWindow,
	limit.Concurrency:   lua.Concurrency,
}

// ceilingCommand is the EVALSHA that redis-benchmark sends: the store's own
// script with the arguments of an admitting take (prelude.lua's order: mode,
// now = 0 for Redis TIME, limit, window µs, extra, cost, need, and for the
// member algorithms id and first).
// Keys and ids are drawn from 10,000 values (-r), as the Go benchmarks' keys
// are. redis-benchmark draws every __rand_int__ on its own, so a sliding
// window's two keys are two unrelated keys of the same slot ({tag} is the
// per-node hash tag in cluster mode, a literal elsewhere): the script does the
// same commands either way.
func ceilingCommand(tb testing.TB, alg limiter.Algorithm) []string {
	src, err := lua.Source(benchScriptNames[alg])
	require.NoError(tb, err)
	sum := sha1.Sum([]byte(src))
	key := func(suffix string) string { return "eg:{tag}:__rand_int__:" + suffix }
	var keys []string
	switch alg {
	case limit.SlidingLog:
		keys = []string{key("sl")}
	case limit.SlidingWindow:
		keys = []string{key("sw:cur"), key("sw:prev")}
	case limit.TokenBucket:
		keys = []string{key("tb")}
	case limit.FixedWindow:
		keys = []string{key("fw")}
	case limit.Concurrency:
		keys = []string{key("cc")}
	}
	l := admitting(alg)
	cmd := append([]string{"EVALSHA", hex.EncodeToString(sum[:]), strconv.Itoa(len(keys))}, keys...)
	cmd = append(cmd, "take", "0", strconv.FormatInt(l.Limit, 10), strconv.FormatInt(l.Window.Microseconds(), 10),
		"0", "1", "1")
	if alg.Spec().Members { // the member id and the first member's index
		cmd = append(cmd, "__rand_int__", "1")
	}
	return cmd
}

// benchRedisBenchmark runs redis-benchmark for b.N script calls against the
// mode's server (a Cluster through any node, with --cluster) and reports its
// own requests per second as decisions/s: the rate Redis reaches for this
// script when the client costs next to nothing. ns/op includes starting the
// process and connecting, a fraction of a percent of a one-second run.
func benchRedisBenchmark(b *testing.B, mode limiter.Mode, alg limiter.Algorithm, pipeline int) float64 {
	bin, err := exec.LookPath("redis-benchmark")
	require.NoError(b, err, "redis-benchmark not found (run \"make tools\")")
	var addr string
	var args []string
	if mode == limiter.ModeCluster {
		addr = clusterSrv().Addrs()[0]
		args = append(args, "--cluster")
	} else {
		addr = standaloneSrv().Addr
	}
	host, port, _ := strings.Cut(addr, ":")
	args = append(args, "-h", host, "-p", port, "-n", strconv.Itoa(b.N), "-c", strconv.Itoa(benchCeilingClients),
		"-P", strconv.Itoa(pipeline), "-r", strconv.Itoa(benchKeys), "--csv")
	args = append(args, ceilingCommand(b, alg)...)
	cmd := exec.Command(bin, args...)
	cpu := startCPU(b, nodesOf(mode))
	b.ResetTimer()
	out, err := cmd.Output()
	b.StopTimer()
	require.NoError(b, err, "redis-benchmark %s: %s", strings.Join(args, " "), out)
	cpu.report(b, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime(), "decision")
	rate, err := parseRedisBenchmarkCSV(out)
	require.NoError(b, err, "redis-benchmark output:\n%s", out)
	if math.IsInf(rate, 0) || rate == 0 { // too few requests for its ms clock
		rate = float64(b.N) / b.Elapsed().Seconds()
	}
	b.ReportMetric(rate, "decisions/s")
	return rate
}

// parseRedisBenchmarkCSV reads the rps column of redis-benchmark --csv (in
// cluster mode, after a preamble listing the masters).
func parseRedisBenchmarkCSV(out []byte) (float64, error) {
	if i := bytes.Index(out, []byte(`"test","rps"`)); i > 0 {
		out = out[i:]
	}
	rows, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return 0, err
	}
	if len(rows) != 2 || len(rows[0]) < 2 || rows[0][1] != "rps" || len(rows[1]) < 2 {
		return 0, fmt.Errorf("unexpected redis-benchmark CSV: %q", rows)
	}
	return strconv.ParseFloat(rows[1][1], 64)
}

// The command redis-benchmark sends must run the store's script and admit: a
// script that replied with an error (NOSCRIPT, a bad argument) would still be
// counted as a request and inflate the ceiling. This sends each once through
// go-redis, after the store loaded its scripts as the benchmark does.
func TestCeilingCommandsRun(t *testing.T) {
	c := client(limiter.ModeStandalone)
	require.NoError(t, redisStore(t, c).Load(ctx(t)))
	for _, alg := range benchAlgorithms {
		cmd := ceilingCommand(t, alg)
		args := make([]any, len(cmd))
		for i, a := range cmd {
			args[i] = strings.ReplaceAll(a, "__rand_int__", "000000000042")
		}
		v, err := c.Do(ctx(t), args...).Int64Slice()
		require.NoError(t, err, alg)
		require.Len(t, v, 5, alg)
		require.EqualValues(t, 1, v[0], "%s: the ceiling's take must admit", alg)
	}
}

// memoryCase is one algorithm at a typical state, for TestRedisMemoryPerKey.
type memoryCase struct {
	name  string
	limit limiter.Limit
	keys  int
	// takes are the times (offsets from t0) of the cost-1 takes that bring a
	// key to the measured state.
	takes []time.Duration
	// members is how many members (units) a key's sorted set holds, for
	// bytes per member; 0 for the counters.
	members int
}

func memoryCases() []memoryCase {
	const w = time.Minute
	spread := func(n int) []time.Duration { // n takes 1 ms apart, all in one window
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i) * ms
		}
		return out
	}
	return []memoryCase{
		{name: "token_bucket", limit: limiter.Limit{Algorithm: limit.TokenBucket, Limit: 100, Window: w}, keys: 1000, takes: spread(1)},
		{name: "fixed_window", limit: limiter.Limit{Algorithm: limit.FixedWindow, Limit: 100, Window: w}, keys: 1000, takes: spread(1)},
		// A take in one window and one in the next: both keys exist.
		{name: "sliding_window", limit: limiter.Limit{Algorithm: limit.SlidingWindow, Limit: 100, Window: w}, keys: 1000, takes: []time.Duration{0, w}},
		{name: "concurrency_10", limit: limiter.Limit{Algorithm: limit.Concurrency, Limit: 10, Window: w}, keys: 1000, takes: spread(10), members: 10},
		// Full logs, each unit its own request (its own member id).
		{name: "sliding_log_10", limit: limiter.Limit{Algorithm: limit.SlidingLog, Limit: 10, Window: w}, keys: 500, takes: spread(10), members: 10},
		{name: "sliding_log_100", limit: limiter.Limit{Algorithm: limit.SlidingLog, Limit: 100, Window: w}, keys: 100, takes: spread(100), members: 100},
		{name: "sliding_log_1000", limit: limiter.Limit{Algorithm: limit.SlidingLog, Limit: 1000, Window: w}, keys: 10, takes: spread(1000), members: 1000},
	}
}

// TestRedisMemoryPerKey measures what each algorithm keeps in Redis per limit
// at a typical state, on a standalone server of its own (so that nothing else
// writes to it), and holds it to bounds, so a change that bloats a key's state
// fails here. Two measures, both averaged over many limits:
//
//   - MEMORY USAGE key SAMPLES 0, summed over the limit's keys (two for the
//     sliding window): the value, the key name and its main-dict entry;
//   - the growth of MEMORY STATS' dataset plus both key hash tables (main and
//     expires) from an emptied server: what the keys really cost, including
//     the expires entry and hash table slots MEMORY USAGE leaves out.
//
// Run it with -v for the table BENCHMARKS.md quotes next to Guan's figures
// (16 B per key for token bucket and fixed window, 8 B × limit for the
// sliding log).
func TestRedisMemoryPerKey(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	// The keys are built and read over connections of their own, closed
	// before the server's total is read: a connection's query and reply
	// buffers (a pipeline of 2000 calls is hundreds of kB) would otherwise be
	// counted with the keys (Redis 7.0's MEMORY STATS puts them in the
	// dataset).
	meter := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
	t.Cleanup(func() { _ = meter.Close() })
	m := &memoryMeter{meter: meter, builder: func(t *testing.T) (redis.UniversalClient, *limiter.RedisStore) {
		c, err := limiter.NewRedisClient(srv.URL(), limiter.ModeStandalone)
		require.NoError(t, err)
		return c, redisStore(t, c)
	}}
	c, st := m.builder(t)
	require.NoError(t, st.Load(ctx(t)), "the script cache is not part of any key")
	require.NoError(t, c.Close())
	// Warm every script up on a tenth of the keys.
	for _, mc := range memoryCases() {
		m.measure(t, mc, max(1, mc.keys/10))
	}
	usage := map[string]float64{}
	total := map[string]float64{}
	t.Logf("%-17s %5s %13s %13s %13s", "state", "keys", "MEMORY USAGE", "server total", "total/unit")
	for _, mc := range memoryCases() {
		var clean bool
		for try := 0; !clean && try < 3; try++ {
			usage[mc.name], total[mc.name], clean = m.measure(t, mc, mc.keys)
		}
		unit := "-"
		if mc.members > 0 {
			unit = fmt.Sprintf("%.1f", total[mc.name]/float64(mc.members))
		}
		note := ""
		if !clean {
			note = " (server memory moved on its own: total is approximate)"
		}
		t.Logf("%-17s %5d %13.1f %13.1f %13s%s", mc.name, mc.keys, usage[mc.name], total[mc.name], unit, note)
	}
	// Bounds well above what Redis 7.0 measures (and below what a second key
	// or a fatter encoding would cost): a counter is one small object, and a
	// unit of a log costs tens of bytes, not hundreds.
	for name, bound := range map[string]float64{
		"token_bucket": 250, "fixed_window": 300, "sliding_window": 550,
		"concurrency_10": 1000, "sliding_log_10": 1000, "sliding_log_100": 100 * 80, "sliding_log_1000": 1000 * 250,
	} {
		require.Less(t, total[name], bound, "%s bytes per limit", name)
		require.Greater(t, total[name], usage[name]*0.9, "%s: the server's total holds at least what MEMORY USAGE counts", name)
	}
	require.Greater(t, total["sliding_log_100"], 5*total["sliding_log_10"], "a sliding log grows with its limit")
	require.Greater(t, total["sliding_log_1000"], 5*total["sliding_log_100"], "a sliding log grows with its limit")
}

// memoryMeter builds limits' keys on an emptied server and reads what they
// cost: the keys are built and read over connections of their own (builder),
// closed before the server's total is read (over meter).
type memoryMeter struct {
	meter   *redis.Client
	builder func(t *testing.T) (redis.UniversalClient, *limiter.RedisStore)
	round   int
}

// measure builds n limits of mc from an emptied server and reads what they
// cost. clean reports that emptying the server again brought it back to
// where it started: the first calls of a script over RESP3 leave tens of
// kB behind that FLUSHALL does not free (freed, some of it, later on),
// which would be counted as the keys'.
func (m *memoryMeter) measure(t *testing.T, mc memoryCase, n int) (usage, total float64, clean bool) {
	m.round++
	require.NoError(t, m.meter.FlushAll(ctx(t)).Err())
	before := keyspaceBytes(t, m.meter)
	c, st := m.builder(t)
	limits := make([]limiter.Limit, n)
	for i := range limits {
		limits[i] = mc.limit
		// As long as production's keys: a rule name and a 64-bit hash.
		limits[i].Key = fmt.Sprintf("rule-%d:%016x", m.round, uint64(i)*0x9e3779b97f4a7c15)
	}
	var reqs []limiter.Request
	for _, d := range mc.takes {
		for _, l := range limits {
			reqs = append(reqs, limiter.Request{Limit: l, Cost: 1, At: t0.Add(d)})
		}
	}
	for len(reqs) > 0 {
		k := min(len(reqs), 2000)
		ds, err := st.Take(ctx(t), reqs[:k])
		require.NoError(t, err)
		for _, d := range ds {
			require.True(t, d.Allowed, "%s: the state is built of admitted takes", mc.name)
		}
		reqs = reqs[k:]
	}
	pipe := c.Pipeline()
	var cmds []*redis.IntCmd
	for _, l := range limits {
		for _, k := range st.Keys(l) {
			cmds = append(cmds, pipe.MemoryUsage(ctx(t), k, 0))
		}
	}
	_, err := pipe.Exec(ctx(t))
	require.NoError(t, err, "every key of %s must exist", mc.name)
	var sum int64
	for _, cmd := range cmds {
		sum += cmd.Val()
	}
	require.NoError(t, c.Close())
	after := keyspaceBytes(t, m.meter)
	require.NoError(t, m.meter.FlushAll(ctx(t)).Err())
	clean = keyspaceBytes(t, m.meter) == before
	return float64(sum) / float64(n), float64(after-before) / float64(n), clean
}

// keyspaceBytes is what db 0's keys cost: MEMORY STATS' dataset.bytes (all
// allocations but the server's overheads) plus db 0's main and expires hash
// tables (overheads, but per key). It first waits until c is the server's only
// client, so that no other connection's buffers are in the dataset.
func keyspaceBytes(t *testing.T, c *redis.Client) int64 {
	require.Eventually(t, func() bool {
		info, err := c.Info(ctx(t), "clients").Result()
		return err == nil && strings.Contains(info, "connected_clients:1\r\n")
	}, 5*time.Second, 5*time.Millisecond, "other connections to the memory test's server did not close")
	stats := flatMap(t, c.Do(ctx(t), "MEMORY", "STATS").Val())
	db := flatMap(t, stats["db.0"])
	n := func(v any) int64 {
		i, ok := v.(int64)
		require.True(t, ok, "MEMORY STATS field %v", v)
		return i
	}
	if len(db) == 0 { // an empty server has no db.0
		return n(stats["dataset.bytes"])
	}
	return n(stats["dataset.bytes"]) + n(db["overhead.hashtable.main"]) + n(db["overhead.hashtable.expires"])
}

// flatMap reads a RESP3 map or a RESP2 flat name/value array.
func flatMap(t *testing.T, v any) map[string]any {
	out := map[string]any{}
	switch v := v.(type) {
	case nil:
	case map[any]any:
		for k, x := range v {
			out[fmt.Sprint(k)] = x
		}
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			out[fmt.Sprint(v[i])] = v[i+1]
		}
	default:
		t.Fatalf("unexpected MEMORY STATS reply %T", v)
	}
	return out
}

// BenchmarkDecideLone is a lone caller: one goroutine deciding one
// single-limit request after another (a token bucket per client, 10,000
// keys, a quota no key reaches) through a Limiter over the Redis connection
// the edge builds at its default flags (defaultConn). Its ns/op and
// allocs/op are what batching by default must not make worse:
//
//	go test -run '^$' -bench BenchmarkDecideLone -benchmem -count 10 ./pkg/limiter/
func BenchmarkDecideLone(b *testing.B) {
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		b.Run(string(mode), func(b *testing.B) {
			st := connStore(b, defaultConn(b, client(mode)))
			require.NoError(b, st.Load(context.Background()))
			lim, err := limiter.New(st, limiter.Config{}, nil, nil)
			require.NoError(b, err)
			limits := benchLimits(b, limiter.Limit{Algorithm: limit.TokenBucket, Limit: 1_000_000, Window: time.Second}, benchKeys)
			checks := []limiter.Check{{Cost: 1}}
			c := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				checks[0].Limit = limits[i%len(limits)]
				v, err := lim.Decide(c, checks)
				if err != nil || !v.Allowed || v.Checks[0].Source != limiter.SourceStore {
					b.Fatalf("decision %d: %+v, %v", i, v, err)
				}
			}
		})
	}
}

// defaultConn is the connection the edge builds at its default flags
// (--redis-autopipeline on).
func defaultConn(tb testing.TB, c redis.UniversalClient) limiter.RedisConn {
	return autoPipelined(tb, c)
}
