// Command rlsbench drives a rate limit service (Envoy's
// envoy.service.ratelimit.v3 API) with a closed loop of ShouldRateLimit
// calls and reports throughput, latency percentiles and the CPU time the
// given processes spent meanwhile, so two implementations can be compared
// per CPU second (scripts/bench-rls.sh).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Result is one run's figures (one JSON line on standard output).
type Result struct {
	Label     string  `json:"label"`
	Calls     int64   `json:"calls"`
	Errors    int64   `json:"errors"`
	OverLimit int64   `json:"over_limit"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"calls_per_second"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	P999us    float64 `json:"p999_us"`
	// CPU seconds each watched process spent during the run, and calls
	// per CPU second of the first one (the service).
	CPU          map[string]float64 `json:"cpu_seconds"`
	PerCPUSecond float64            `json:"calls_per_cpu_second"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "rate limit service address")
	label := flag.String("label", "", "name of this run in the output")
	domain := flag.String("domain", "bench", "domain")
	key := flag.String("key", "user", "descriptor key")
	keys := flag.Int("keys", 10000, "distinct descriptor values")
	conc := flag.Int("concurrency", 32, "calls in flight")
	conns := flag.Int("conns", 4, "gRPC connections")
	warm := flag.Duration("warmup", 2*time.Second, "unmeasured warm-up")
	dur := flag.Duration("duration", 10*time.Second, "measured duration")
	pids := flag.String("pids", "", "name=pid,... processes whose CPU time is reported (the first is the service)")
	flag.Parse()
	r, err := run(*addr, *domain, *key, *keys, *conc, *conns, *warm, *dur, *pids)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
	r.Label = *label
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func run(addr, domain, key string, keys, conc, nconns int, warm, dur time.Duration, pidList string) (*Result, error) {
	var clients []pb.RateLimitServiceClient
	for range nconns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients = append(clients, pb.NewRateLimitServiceClient(c))
	}
	watched, err := parsePids(pidList)
	if err != nil {
		return nil, err
	}
	var measuring atomic.Bool
	var calls, errs, over atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	for g := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			cl := clients[g%len(clients)]
			for ctx.Err() == nil {
				req := &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{{
					Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: "v" + strconv.Itoa(rng.IntN(keys))}},
				}}}
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				start := time.Now()
				resp, err := cl.ShouldRateLimit(cctx, req)
				took := time.Since(start)
				ccancel()
				if !measuring.Load() {
					continue
				}
				switch {
				case err != nil:
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				case resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				}
				calls.Add(1)
				lat[g] = append(lat[g], took)
			}
		})
	}
	time.Sleep(warm)
	before, err := cpuTimes(watched)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	start := time.Now()
	measuring.Store(true)
	time.Sleep(dur)
	measuring.Store(false)
	elapsed := time.Since(start)
	after, err := cpuTimes(watched)
	cancel()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds())
	}
	r := &Result{Calls: calls.Load(), Errors: errs.Load(), OverLimit: over.Load(), Seconds: elapsed.Seconds(),
		P50us: pct(0.50), P99us: pct(0.99), P999us: pct(0.999), CPU: map[string]float64{}}
	r.PerSecond = float64(r.Calls) / r.Seconds
	for i, w := range watched {
		r.CPU[w.name] = after[i] - before[i]
	}
	if len(watched) > 0 && r.CPU[watched[0].name] > 0 {
		r.PerCPUSecond = float64(r.Calls) / r.CPU[watched[0].name]
	}
	return r, nil
}

type proc struct {
	name string
	pid  int
}

func parsePids(s string) ([]proc, error) {
	var out []proc
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		name, p, ok := strings.Cut(f, "=")
		pid, err := strconv.Atoi(p)
		if !ok || err != nil {
			return nil, fmt.Errorf("-pids: want name=pid, got %q", f)
		}
		out = append(out, proc{name, pid})
	}
	return out, nil
}

// cpuTimes reads each process's user+system CPU seconds from /proc (in
// USER_HZ ticks, 100 per second on Linux).
func cpuTimes(ps []proc) ([]float64, error) {
	out := make([]float64, len(ps))
	for i, p := range ps {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/stat")
		if err != nil {
			return nil, err
		}
		// Fields after the command name (which may hold spaces) start at ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		ut, err1 := strconv.ParseFloat(f[11], 64)
		st, err2 := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("reading /proc/%d/stat", p.pid)
		}
		out[i] = (ut + st) / 100
	}
	return out, nil
}
