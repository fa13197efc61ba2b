package peerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// TenantsConfig is a run of Tenants.
type TenantsConfig struct {
	EdgeBin, NginxBin string
	// EdgeArgs are more flags for the edge; none in the measurement, which
	// runs the edge at its defaults (with --trusted-proxies naming the
	// critical clients' address, as an operator names its health checker).
	EdgeArgs []string
	// Phase is how long each phase lasts: b.example alone, then beside
	// a.example's load.
	Phase time.Duration
	// Slow is how long the origin takes to answer a.example in the
	// slow-origin scenario.
	Slow time.Duration
	// AClients connections (one client each) from ASources addresses keep
	// requesting a.example in the slow-origin scenario; Critical more, from
	// the trusted address, ask for a.example at the critical tier.
	AClients, ASources, Critical int
	// BConns connections from one other address keep requesting b.example.
	BConns int
	// In the flood scenario a.example is requested on FloodFactor × the
	// edge's workers connections (FloodConns, when set, instead) from
	// FloodSources addresses, through an origin that answers at once.
	FloodFactor, FloodConns, FloodSources int
	// APool, when set, gives a.example a pool of its own in a host table
	// (--hosts), the same origin behind it, with these concurrency
	// settings: an operator bounding the slow tenant. Empty: the defaults.
	APool *PoolLimit
	// Scenarios are those to run, of "slow" and "flood", in this order.
	Scenarios []string
	Out       io.Writer
}

// DefaultTenantsConfig is the measurement make bench-tenants runs: issue
// 51's scale.
func DefaultTenantsConfig() TenantsConfig {
	return TenantsConfig{Phase: 20 * time.Second, Slow: 5 * time.Second, AClients: 1200, ASources: 5, Critical: 2,
		BConns: 8, FloodFactor: 3, FloodSources: 48, Scenarios: []string{"slow", "flood"}, Out: os.Stdout}
}

// SmokeTenantsConfig is the same run scaled down to a few seconds: 40
// clients, a 1 s slowdown, an edge of 32 workers (so a.example is held to
// its share of 16, twice b.example's 8 connections), a flood of 64
// connections from 40 addresses.
func SmokeTenantsConfig() TenantsConfig {
	c := DefaultTenantsConfig()
	c.EdgeArgs = []string{"--workers", "32"}
	c.Phase, c.Slow, c.AClients, c.FloodConns, c.FloodSources = time.Second, time.Second, 40, 64, 40
	return c
}

func (c TenantsConfig) validate() error {
	var errs []error
	if c.Phase < 500*time.Millisecond || c.Slow < 0 || c.Slow > time.Minute {
		errs = append(errs, fmt.Errorf("phase %s must be at least 500ms, slowdown %s from 0 to 1m", c.Phase, c.Slow))
	}
	if c.AClients < 1 || c.ASources < 1 || c.ASources > 200 || c.BConns < 1 || c.Critical < 0 {
		errs = append(errs, fmt.Errorf("a.example's clients (%d), its addresses (%d, at most 200) and b.example's connections (%d) must be at least 1, critical clients (%d) not negative",
			c.AClients, c.ASources, c.BConns, c.Critical))
	}
	if c.FloodSources < 1 || c.FloodSources > 250 || (c.FloodConns < 1 && c.FloodFactor < 1) || c.FloodConns > 20000 {
		errs = append(errs, fmt.Errorf("the flood needs 1 to 250 addresses (%d) and a factor (%d) or up to 20000 connections (%d)", c.FloodSources, c.FloodFactor, c.FloodConns))
	}
	if len(c.Scenarios) == 0 || slices.ContainsFunc(c.Scenarios, func(s string) bool { return s != "slow" && s != "flood" }) {
		errs = append(errs, fmt.Errorf("scenarios %q: want slow, flood or both", c.Scenarios))
	}
	if c.EdgeBin == "" || c.NginxBin == "" {
		errs = append(errs, errors.New("no edge or nginx binary given"))
	}
	return errors.Join(errs...)
}

// PoolLimit is a host table pool's concurrency settings (docs/hosts.md).
type PoolLimit struct {
	Limit, Queue int
	QueueTimeout time.Duration
}

// ParsePoolLimit reads LIMIT,QUEUE,QUEUE_TIMEOUT (512,1200,10s).
func ParsePoolLimit(s string) (*PoolLimit, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return nil, fmt.Errorf("pool limit %q: want LIMIT,QUEUE,QUEUE_TIMEOUT", s)
	}
	limit, err1 := strconv.Atoi(f[0])
	queue, err2 := strconv.Atoi(f[1])
	qt, err3 := time.ParseDuration(f[2])
	if err := errors.Join(err1, err2, err3); err != nil || limit < 1 || queue < 0 || qt < 0 {
		return nil, fmt.Errorf("pool limit %q: want a limit of at least 1, a queue and a queue timeout not negative: %v", s, err)
	}
	return &PoolLimit{Limit: limit, Queue: queue, QueueTimeout: qt}, nil
}

// hostTable sends slowHost to a pool of its own at origin, with p's limit.
func (p *PoolLimit) hostTable(dir, origin string) (string, error) {
	f := filepath.Join(dir, "hosts.yaml")
	text := fmt.Sprintf("version: 1\npools:\n  tenant_a:\n    urls: [\"http://%s\"]\n    concurrency: {limit: %d, queue: %d, queue_timeout: %s}\nhosts:\n  %s: {pool: tenant_a}\n",
		origin, p.Limit, p.Queue, p.QueueTimeout, slowHost)
	return f, os.WriteFile(f, []byte(text), 0o644)
}

// The client addresses: the trusted one sends the critical requests, the
// innocent tenant's client has one of its own, a.example's clients and
// the flood come from theirs.
const (
	trustedSource = "127.0.0.1"
	bSource       = "127.0.0.9"
	fastHost      = "b.example"
)

func aSources(n int) []string     { return sources("127.0.2.", n) }
func floodSources(n int) []string { return sources("127.0.1.", n) }

func sources(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i+1)
	}
	return out
}

// count is what one host's clients got in one phase, each request counted
// in the phase it was sent in and only once answered (or failed).
type count struct {
	mu       sync.Mutex
	sent     int
	ok       int   // 200
	refused  int   // 503
	other    int   // any other status
	errs     int   // no answer: a socket error or a timeout
	firstErr error // the first of them
	refusal  string
	oddity   string          // the first other status and its body
	lat      []time.Duration // of the 200s
}

func (c *count) add(code int, body []byte, d time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent++
	switch {
	case err != nil:
		c.errs++
		if c.firstErr == nil {
			c.firstErr = err
		}
	case code == http.StatusOK:
		c.ok++
		c.lat = append(c.lat, d)
	case code == http.StatusServiceUnavailable:
		c.refused++
		if c.refusal == "" {
			c.refusal = string(body)
		}
	default:
		c.other++
		if c.oddity == "" {
			c.oddity = fmt.Sprintf("%d %s", code, body[:min(len(body), 300)])
		}
	}
}

// p99 is the 99th percentile of the answered requests' latency, 0 if none.
func (c *count) p99() time.Duration {
	if len(c.lat) == 0 {
		return 0
	}
	return pct(c.lat).p99
}

// TenantRun is one target (the edge or nginx) in one scenario.
type TenantRun struct {
	Scenario, Target string
	Phase            time.Duration
	BQuiet, BDuring  *count // b.example alone, then beside a.example
	A, Crit          *count // a.example's clients and its critical ones, in the second phase
	// Share is what a.example may hold at once: the edge's host share read
	// mid-phase (or its pool's limit, if smaller), for nginx every client; Rounds is how many answers each
	// held place can give in the phase (each request sent in it counts).
	Share, Rounds int
	Workers       int    // the edge's worker capacity, 0 for nginx
	Conns         int    // a.example's connections
	Load          string // the load average at the end of the phase
	// ProxyCPU is the CPU seconds the proxy's processes spent in each phase
	// (quiet, beside a.example), LoadCPU those a.example's client processes
	// spent: on a machine of few cores, what b.example's latency competes
	// with.
	ProxyCPU    [2]float64
	LoadCPU     float64
	EdgeMetrics string // the edge's shedder and outcome lines after the run
}

// Goal is one of issue 51's goals for one run.
type Goal struct {
	What, Figure string
	Met          bool
}

// Goals are the goals this run is held to: b.example keeps 95 % of its
// quiet goodput, read two ways: the share of its requests answered 200
// (the "succeeded") and the 200s it got a second (which, on a
// machine of few cores, a.example's clients' CPU takes from too),
// with a p99 within 1.5× of its quiet one (in the slow-origin scenario);
// a.example gets its share's worth of answers (at least 90 % of share ×
// rounds, in the slow-origin scenario); no critical request is refused.
func (r *TenantRun) Goals() []Goal {
	var gs []Goal
	bq, bd := r.BQuiet, r.BDuring
	rateQ, rateD := float64(bq.ok)/r.Phase.Seconds(), float64(bd.ok)/r.Phase.Seconds()
	succQ, succD := ratio(float64(bq.ok), float64(bq.sent)), ratio(float64(bd.ok), float64(bd.sent))
	gs = append(gs, Goal{"b.example succeeded ≥ 95 % of quiet",
		fmt.Sprintf("%.2f %% of %.2f %%", 100*succD, 100*succQ), bd.sent > 0 && succD >= 0.95*succQ})
	gs = append(gs, Goal{"b.example 200s a second ≥ 95 % of quiet",
		fmt.Sprintf("%.0f/s of %.0f/s (%.1f %%)", rateD, rateQ, 100*ratio(rateD, rateQ)), ratio(rateD, rateQ) >= 0.95})
	if r.Scenario != "slow" {
		return gs
	}
	gs = append(gs, Goal{"b.example p99 ≤ 1.5× quiet",
		fmt.Sprintf("%s vs %s (%.2f×)", ms(bd.p99()), ms(bq.p99()), ratio(float64(bd.p99()), float64(bq.p99()))),
		bq.p99() > 0 && bd.p99() > 0 && bd.p99() <= bq.p99()*3/2})
	want := r.Share * r.Rounds
	gs = append(gs, Goal{"a.example answered ≥ 90 % of share × rounds",
		fmt.Sprintf("%d of %d × %d = %d", r.A.ok, r.Share, r.Rounds, want), want > 0 && float64(r.A.ok) >= 0.9*float64(want)})
	gs = append(gs, Goal{"nothing critical refused",
		fmt.Sprintf("%d of %d answered", r.Crit.ok, r.Crit.sent), r.Crit.sent > 0 && r.Crit.ok == r.Crit.sent})
	return gs
}

// Tenants is issue 51's test at its own scale, the edge (at its defaults)
// beside nginx, each alone in front of one origin on loopback, in two
// scenarios: "slow", where the origin answers a.example after cfg.Slow and
// b.example at once and AClients clients keep requesting a.example, and
// "flood", where a.example is flooded on many connections through an origin
// that answers at once. In both, b.example is requested on BConns
// connections alone for a phase, then for a phase beside a.example. It
// prints each run's figures, the table and the goals.
func Tenants(ctx context.Context, cfg TenantsConfig) ([]*TenantRun, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "peerbench-tenants-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var runs []*TenantRun
	for _, sc := range cfg.Scenarios {
		delay := cfg.Slow
		if sc == "flood" {
			delay = 0
		}
		scDir := filepath.Join(dir, sc)
		if err := os.MkdirAll(scDir, 0o755); err != nil {
			return nil, err
		}
		origin, err := startOriginAs(ctx, scDir, "origin", hostOriginEnv, hostDelayEnv+"="+delay.String())
		if err != nil {
			return nil, err
		}
		floodConns := cfg.FloodConns
		for _, target := range []string{"edge", "nginx"} {
			r, err := tenantRun(ctx, cfg, scDir, sc, target, origin.addr, &floodConns)
			if err != nil {
				origin.stop()
				return runs, fmt.Errorf("%s/%s: %w", sc, target, err)
			}
			runs = append(runs, r)
			r.print(cfg.Out)
		}
		origin.stop()
	}
	printTenants(cfg.Out, cfg, runs)
	return runs, nil
}

// tenantRun starts target, runs the two phases against it and stops it.
// The flood's connections are fixed by the edge's run (its workers ×
// FloodFactor) and kept for nginx's.
func tenantRun(ctx context.Context, cfg TenantsConfig, dir, sc, target, origin string, floodConns *int) (*TenantRun, error) {
	var srv *server
	var err error
	if target == "edge" {
		args := cfg.EdgeArgs
		if cfg.APool != nil {
			f, err := cfg.APool.hostTable(dir, origin)
			if err != nil {
				return nil, err
			}
			args = append(slices.Clone(args), "--hosts", f)
		}
		srv, err = startDefaultEdge(ctx, cfg.EdgeBin, dir, origin, args...)
	} else {
		srv, err = startNginx(ctx, cfg.NginxBin, dir, origin, "0")
	}
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	r := &TenantRun{Scenario: sc, Target: target, Phase: cfg.Phase,
		BQuiet: &count{}, BDuring: &count{}, A: &count{}, Crit: &count{}}
	if srv.admin != "" {
		r.Workers = int(metricValue(ctx, srv.admin, "edgeguard_shedder_workers_capacity"))
		if r.Workers < 1 {
			return nil, errors.New("the edge reports no worker capacity")
		}
	}
	if sc == "flood" && *floodConns == 0 {
		*floodConns = cfg.FloodFactor * r.Workers
	}

	start := time.Now()
	cpu0 := cpuSeconds(srv.pid())
	second := start.Add(cfg.Phase)
	end := second.Add(cfg.Phase)
	var wg sync.WaitGroup
	bCtx, bCancel := context.WithDeadline(ctx, end)
	defer bCancel()
	timeout := cfg.Slow + 10*time.Second
	drive(bCtx, &wg, srv.addr, []string{bSource}, fastHost, "", cfg.BConns, timeout, func(sent time.Time) *count {
		if sent.Before(second) {
			return r.BQuiet
		}
		return r.BDuring
	})
	select {
	case <-time.After(time.Until(second)):
	case <-ctx.Done():
		wg.Wait()
		return nil, ctx.Err()
	}
	cpu1 := cpuSeconds(srv.pid())
	// a.example's clients, each load in a process of its own.
	var loads []*childLoad
	var into []*count
	spec := loadSpec{Addr: srv.addr, Host: slowHost, Timeout: timeout, Until: end}
	if sc == "slow" {
		r.Conns = cfg.AClients
		a, crit := spec, spec
		a.Sources, a.Conns = aSources(cfg.ASources), cfg.AClients
		crit.Sources, crit.Conns, crit.Priority = []string{trustedSource}, cfg.Critical, "critical"
		for _, l := range []struct {
			spec loadSpec
			c    *count
		}{{a, r.A}, {crit, r.Crit}} {
			if l.spec.Conns < 1 {
				continue
			}
			cl, err := startLoad(l.spec)
			if err != nil {
				bCancel()
				wg.Wait()
				return nil, err
			}
			loads, into = append(loads, cl), append(into, l.c)
		}
	} else {
		r.Conns = *floodConns
		spec.Sources, spec.Conns = floodSources(cfg.FloodSources), *floodConns
		cl, err := startLoad(spec)
		if err != nil {
			bCancel()
			wg.Wait()
			return nil, err
		}
		loads, into = append(loads, cl), append(into, r.A)
	}
	// a.example's share, read once both hosts have been active a while.
	r.Share = cfg.AClients
	if sc == "flood" {
		r.Share = *floodConns
	}
	select {
	case <-time.After(time.Until(second.Add(cfg.Phase / 2))):
		if srv.admin != "" {
			if s := int(metricValue(ctx, srv.admin, "edgeguard_shedder_host_share")); s > 0 {
				r.Share = min(r.Share, s)
			}
			if cfg.APool != nil {
				r.Share = min(r.Share, cfg.APool.Limit) // its pool's limit holds it to less
			}
		}
	case <-ctx.Done():
	}
	wg.Wait()
	r.ProxyCPU = [2]float64{cpu1 - cpu0, cpuSeconds(srv.pid()) - cpu1}
	var loadErr error
	for i, l := range loads {
		if err := l.wait(into[i]); err != nil && loadErr == nil {
			loadErr = err
		}
		if st := l.cmd.ProcessState; st != nil {
			r.LoadCPU += (st.UserTime() + st.SystemTime()).Seconds()
		}
	}
	r.Load = loadavg()
	if cfg.Slow > 0 && sc == "slow" {
		r.Rounds = int((cfg.Phase + cfg.Slow - 1) / cfg.Slow) // a request sent in the phase counts, answered after it or not
	}
	if srv.admin != "" {
		for _, p := range []string{"edgeguard_shedder_rejected_total", "edgeguard_shedder_host_", "edgeguard_edge_requests_total", "edgeguard_edge_connections_refused_total", "edgeguard_origin_concurrency_"} {
			r.EdgeMetrics += metricLines(ctx, srv.admin, p)
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return r, loadErr
}

// startDefaultEdge runs the edge at its defaults in front of origin: only
// its addresses, the trusted proxy that sends the critical requests and
// how it shuts down (at once: nothing is measured then) are set.
func startDefaultEdge(ctx context.Context, bin, dir, origin string, extra ...string) (*server, error) {
	a, err := ports(2)
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--listen", a[0], "--admin", a[1], "--origin", "http://" + origin,
		"--trusted-proxies", trustedSource + "/32",
		"--drain-delay", "0s", "--shutdown-timeout", "2s",
	}, extra...)
	cmd := exec.Command(bin, args...)
	// Only these flags configure the edge (as in startEdgeAs).
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "EDGEGUARD_") })
	s, err := startServing(ctx, "edge", dir, cmd, a[0])
	if err != nil {
		return nil, err
	}
	s.admin = a[1]
	return s, nil
}

// drive keeps conns connections, spread over the source addresses in
// turn, each sending GET /item for host back to back until ctx ends; each
// request is counted, once answered, in the count at returns for the time
// it was sent. A request in flight when ctx ends is waited for, not cut.
// priority, when set, goes in X-Priority.
func drive(ctx context.Context, wg *sync.WaitGroup, addr string, srcs []string, host, priority string, conns int, timeout time.Duration, at func(time.Time) *count) {
	for i := range conns {
		src := srcs[i%len(srcs)]
		wg.Go(func() {
			d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			c := &fasthttp.HostClient{Addr: addr, MaxConns: 1, MaxIdemponentCallAttempts: 1,
				Dial: func(a string) (net.Conn, error) { return d.Dial("tcp", a) }}
			defer c.CloseIdleConnections()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/item")
			req.UseHostHeader = true // the tenant's name, not the address dialled
			req.Header.SetHost(host)
			if priority != "" {
				req.Header.Set("X-Priority", priority)
			}
			deadline, bounded := ctx.Deadline()
			for ctx.Err() == nil {
				sent := time.Now()
				if bounded && !sent.Before(deadline) {
					return // the phase is over, though its timer has not fired yet
				}
				err := c.DoTimeout(req, resp, timeout)
				took := time.Since(sent)
				if err != nil {
					err = fmt.Errorf("from %s for %s: %w", src, host, err)
				}
				at(sent).add(resp.StatusCode(), resp.Body(), took, err)
				if err != nil && ctx.Err() == nil {
					// Not a busy loop on a refused connection: the next try
					// waits for the dialer or the timeout, as a client would.
					select {
					case <-time.After(10 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}
		})
	}
}

// metricValue sums the samples of the edge's metric name (no labels
// asked); -1 if it cannot be read.
func metricValue(ctx context.Context, admin, name string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	total, seen := 0.0, false
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total, seen = total+v, true
		}
	}
	if !seen {
		return -1
	}
	return total
}

func (r *TenantRun) print(w io.Writer) {
	fmt.Fprintf(w, "%s/%s (phase %s, load %s): b.example quiet %d/%d ok, p99 %s; beside a.example %d/%d ok (503 %d, other %d, no answer %d), p99 %s; a.example on %d connections: %d answered, %d 503, %d other, %d no answer",
		r.Scenario, r.Target, r.Phase, r.Load, r.BQuiet.ok, r.BQuiet.sent, ms(r.BQuiet.p99()),
		r.BDuring.ok, r.BDuring.sent, r.BDuring.refused, r.BDuring.other, r.BDuring.errs, ms(r.BDuring.p99()),
		r.Conns, r.A.ok, r.A.refused, r.A.other, r.A.errs)
	if r.Crit.sent > 0 {
		fmt.Fprintf(w, "; critical %d/%d ok", r.Crit.ok, r.Crit.sent)
	}
	fmt.Fprintf(w, "; CPU seconds: %s %.1f quiet, %.1f beside a.example; a.example's clients %.1f\n", r.Target, r.ProxyCPU[0], r.ProxyCPU[1], r.LoadCPU)
	for _, c := range []*count{r.BQuiet, r.BDuring, r.A, r.Crit} {
		if c.firstErr != nil {
			fmt.Fprintf(w, "  first failure: %v\n", c.firstErr)
		}
	}
	if r.A.refusal != "" {
		fmt.Fprintf(w, "  a.example's first 503: %s\n", strings.TrimSpace(r.A.refusal))
	}
	for _, c := range []*count{r.BQuiet, r.BDuring, r.A, r.Crit} {
		if c.oddity != "" {
			fmt.Fprintf(w, "  first other answer: %s\n", strings.TrimSpace(c.oddity))
		}
	}
	if r.EdgeMetrics != "" {
		for _, l := range strings.Split(strings.TrimSpace(r.EdgeMetrics), "\n") {
			if !strings.HasSuffix(l, " 0") {
				fmt.Fprintln(w, "  "+l)
			}
		}
	}
}

func printTenants(w io.Writer, cfg TenantsConfig, runs []*TenantRun) {
	fmt.Fprintf(w, "\nTenant isolation, phases of %s, a.example's origin %s slow (load average at the end: %s)\n", cfg.Phase, cfg.Slow, loadavg())
	if cfg.APool != nil {
		fmt.Fprintf(w, "The edge gives a.example a pool of its own: concurrency limit %d, queue %d, queue timeout %s\n", cfg.APool.Limit, cfg.APool.Queue, cfg.APool.QueueTimeout)
	} else if len(cfg.EdgeArgs) > 0 {
		fmt.Fprintf(w, "The edge with %q\n", cfg.EdgeArgs)
	} else {
		fmt.Fprintln(w, "The edge at its defaults")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | target | b.example quiet | p99 | b.example beside a.example | p99 | a.example answered | 503 | critical |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		crit := "—"
		if r.Crit.sent > 0 {
			crit = fmt.Sprintf("%d of %d", r.Crit.ok, r.Crit.sent)
		}
		fmt.Fprintf(w, "| %s | %s | %d of %d | %s | %d of %d | %s | %d | %d | %s |\n", r.Scenario, r.Target,
			r.BQuiet.ok, r.BQuiet.sent, ms(r.BQuiet.p99()), r.BDuring.ok, r.BDuring.sent, ms(r.BDuring.p99()), r.A.ok, r.A.refused, crit)
	}
	fmt.Fprintln(w)
	for _, r := range runs {
		for _, g := range r.Goals() {
			verdict := "FAIL"
			if g.Met {
				verdict = "PASS"
			}
			fmt.Fprintf(w, "%s %s/%s: %s: %s\n", verdict, r.Scenario, r.Target, g.What, g.Figure)
		}
	}
}
