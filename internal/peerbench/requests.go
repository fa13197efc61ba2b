package peerbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// The peers' configurations, one template each, and the edge's rules and
// shedder settings for the scenarios that need them.
//
//go:embed peers
var peerFiles embed.FS

var peerTemplates = template.Must(template.ParseFS(peerFiles, "peers/*.tmpl"))

// RequestsConfig is a run of Requests.
type RequestsConfig struct {
	EdgeBin, NginxBin, HAProxyBin, WrkBin string
	H2loadBin                             string        // the HTTP/2 scenario's load generator (nghttp2's h2load)
	Sets                                  int           // each target once per set, the proxies' order rotated
	Threads, Conns                        int           // wrk's -t and -c; Conns is also the fixed-rate client's connections
	H2Clients, H2Streams                  int           // h2load's -c and -m (the HTTP/2 scenario)
	Warmup                                time.Duration // an unmeasured wrk run before each measured one; 0 = none
	Duration                              time.Duration // each measured wrk run (whole seconds)
	// FixedDuration is the fixed-rate run at half the peak wrk measured, for
	// its p99; 0 = none.
	FixedDuration time.Duration
	// Smoke checks what each scenario promises besides the figures: the
	// forwarding fields the origin receives, 429s and their RateLimit fields,
	// the edge's 503s counted as shed by the ramp, the access logs written.
	// Requests runs these checks in every mode; Smoke only names the short
	// mode in the output.
	Smoke bool
	// Scenarios are the scenarios to run, by name (empty: all of them).
	Scenarios []string
	Out       io.Writer
}

// DefaultRequestsConfig is the measurement make bench-peers runs.
func DefaultRequestsConfig() RequestsConfig {
	return RequestsConfig{WrkBin: "wrk", H2loadBin: "h2load", Sets: 3, Threads: 2, Conns: 64, H2Clients: 16, H2Streams: 10,
		Warmup: 2 * time.Second, Duration: 10 * time.Second, FixedDuration: 5 * time.Second, Out: os.Stdout}
}

// SmokeRequestsConfig is about a second per target, every scenario and
// peer started and checked, one set.
func SmokeRequestsConfig() RequestsConfig {
	c := DefaultRequestsConfig()
	c.Sets, c.Warmup, c.Duration, c.FixedDuration, c.Smoke = 1, 0, time.Second, 300*time.Millisecond, true
	return c
}

func (c RequestsConfig) validate() error {
	var errs []error
	if c.Sets < 1 || c.Threads < 1 || c.Conns < c.Threads {
		errs = append(errs, fmt.Errorf("sets (%d) and threads (%d) must be at least 1, connections (%d) at least the threads", c.Sets, c.Threads, c.Conns))
	}
	if c.H2Clients < 1 || c.H2Streams < 1 {
		errs = append(errs, fmt.Errorf("h2load's clients (%d) and streams per client (%d) must be at least 1", c.H2Clients, c.H2Streams))
	}
	if c.Duration < time.Second || c.Warmup < 0 || c.FixedDuration < 0 {
		errs = append(errs, fmt.Errorf("duration %s must be at least 1s, warm-up %s and fixed-rate duration %s not negative", c.Duration, c.Warmup, c.FixedDuration))
	}
	for _, name := range c.Scenarios {
		if !slices.ContainsFunc(scenarios, func(sc scenario) bool { return sc.name == name }) {
			errs = append(errs, fmt.Errorf("unknown scenario %q", name))
		}
	}
	for what, bin := range map[string]string{"edge": c.EdgeBin, "nginx": c.NginxBin, "haproxy": c.HAProxyBin, "wrk": c.WrkBin, "h2load": c.H2loadBin} {
		if bin == "" {
			errs = append(errs, fmt.Errorf("no %s binary given", what))
		}
	}
	return errors.Join(errs...)
}

// The proxies, in the order of the first set, and the scenarios, in the
// order of the table.
var (
	proxies   = []string{"edge", "nginx", "haproxy"}
	scenarios = []scenario{
		{name: "proxied", what: "proxied, no rules", status: http.StatusOK},
		{name: "accesslog", what: "proxied, JSON access log", status: http.StatusOK, accessLog: true},
		{name: "rule", what: "one per-client rule, not reached", status: http.StatusOK, rate: 1000000, burst: 1000000},
		{name: "denied", what: "one-key flood, 10/s limit: 429", status: http.StatusTooManyRequests, rate: 10},
		{name: "shed", what: "shed by the ramp: 503 (edge only)", status: http.StatusServiceUnavailable, edgeOnly: true},
		{name: "tls", what: "proxied, TLS keep-alive (ECDSA P-256)", status: http.StatusOK, tls: true},
		{name: "h2", what: "proxied, HTTP/2 over TLS (h2load)", status: http.StatusOK, tls: true, h2: true},
	}
)

// scenario is one configuration every proxy runs (or the edge alone).
type scenario struct {
	name, what string
	status     int  // what every measured request is answered
	accessLog  bool // one JSON line per request, to a file
	rate       int  // per-client requests a second; 0 = no rule
	burst      int  // nginx's limit_req burst (the edge's leaky bucket: its capacity)
	edgeOnly   bool
	tls        bool // measured over TLS (HTTP/1.1, kept alive), the one certificate for all
	// h2: the TLS listener offers h2 (ALPN) and h2load measures it over
	// HTTP/2 (the proxies still speak HTTP/1.1 to the origin); no
	// fixed-rate run (its client speaks HTTP/1.1) and no p99.
	h2 bool
}

// peerConf is what a peer's template is filled in with.
type peerConf struct {
	Dir, Origin, Listen, Who string
	AccessLog                string // nginx: the file; haproxy: set when it logs (to its standard output)
	Rate, Burst              int
	TLSListen, Cert          string // a second, TLS listener and its PEM (certificate and key)
	H2                       bool   // the TLS listener offers h2 (ALPN) besides http/1.1
}

// target is one proxy (or the origin) in one scenario.
type target struct {
	scenario scenario
	proxy    string // edge, nginx, haproxy; origin for the floor
	srv      *server
	addr     string // where the measured requests go (the TLS listener, else srv.addr)
	cert     *benchCert
	log      string // its access log, if it writes one
	holds    func() // ends the requests holding the edge's workers (shed)
}

func (t *target) key() string { return t.scenario.name + "/" + t.proxy }

func (t *target) url(path string) string {
	if t.scenario.tls {
		return "https://" + t.addr + path
	}
	return "http://" + t.addr + path
}

// sample is one target's figures in one set.
type sample struct {
	wrk         wrkResult
	proxyCPU    float64 // CPU seconds per request: the proxy's processes
	originCPU   float64 // and the origin's
	fixedP99    time.Duration
	fixedRate   float64
	loadAverage string
}

// RequestsResult holds every set's samples by target (scenario/proxy).
type RequestsResult struct {
	Samples map[string][]sample
	Checks  []string // what was checked, one line each
}

var floor = scenario{name: "floor", what: "floor: the origin alone", status: http.StatusOK}

// Requests measures what a request costs each proxy, scenario by scenario,
// in front of one fasthttp origin on loopback: wrk at full load gives the
// requests/s and the CPU each proxy and the origin spent per request (from
// /proc), then a fixed-rate client at half that load gives the p99. Every
// target runs once in each of cfg.Sets sets, the proxies' order rotated from
// set to set. It prints each measurement and then the table.
func Requests(ctx context.Context, cfg RequestsConfig) (*RequestsResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "peerbench-requests-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	origin, err := startOriginAs(ctx, dir, "origin", fastOriginEnv)
	if err != nil {
		return nil, err
	}
	defer origin.stop()
	cert, err := newBenchCert(dir)
	if err != nil {
		return nil, err
	}
	targets := map[string]*target{"floor/origin": {scenario: floor, proxy: "origin", srv: origin, addr: origin.addr}}
	defer func() {
		for _, t := range targets {
			if t.holds != nil {
				t.holds()
			}
			if t.proxy != "origin" {
				t.srv.stop()
			}
		}
	}()
	for _, sc := range cfg.picked() {
		for _, p := range proxies {
			if sc.edgeOnly && p != "edge" {
				continue
			}
			t, err := startTarget(ctx, cfg, dir, sc, p, origin.addr, cert)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", sc.name, p, err)
			}
			targets[t.key()] = t
		}
	}
	res := &RequestsResult{Samples: map[string][]sample{}}
	w := cfg.Out
	// Before any figure: each proxy writes what it promises to the origin.
	for _, t := range targets {
		if t.proxy == "origin" || t.scenario.status != http.StatusOK {
			continue
		}
		if err := checkForwarding(ctx, t); err != nil {
			return res, fmt.Errorf("%s: %w", t.key(), err)
		}
	}
	res.Checks = append(res.Checks, "forwarding: every proxy of proxied, accesslog, rule, tls and h2 (the client's request over HTTP/2) sent the origin X-Forwarded-For, -Proto, -Host, Forwarded and X-Request-ID of its own and none of the client's spoofed X-Real-IP, True-Client-IP, X-Client-IP, CF-Connecting-IP, X-Cluster-Client-IP")
	mode := "full"
	if cfg.Smoke {
		mode = "smoke"
	}
	fmt.Fprintf(w, "# peerbench requests (%s): wrk -t%d -c%d, %s warm-up, %s measured; fixed rate at half the peak for %s; %d sets\n",
		mode, cfg.Threads, cfg.Conns, cfg.Warmup, cfg.Duration, cfg.FixedDuration, cfg.Sets)
	fmt.Fprintf(w, "# set scenario proxy requests/s proxy-cpu-us/req proxy+origin-cpu-us/req p99@peak p99@half(rate) non-2xx/3xx load\n")
	for set := 1; set <= cfg.Sets; set++ {
		order := rotate(proxies, set-1)
		run := []*target{targets["floor/origin"]}
		for _, sc := range cfg.picked() {
			for _, p := range order {
				if t := targets[sc.name+"/"+p]; t != nil {
					run = append(run, t)
				}
			}
		}
		for _, t := range run {
			s, err := measure(ctx, cfg, t, origin)
			if err != nil {
				return res, fmt.Errorf("set %d, %s: %w", set, t.key(), err)
			}
			if err := checkWrk(t, s.wrk); err != nil {
				return res, fmt.Errorf("set %d, %s: %w", set, t.key(), err)
			}
			res.Samples[t.key()] = append(res.Samples[t.key()], s)
			p99s := fmt.Sprintf("%s %s(%.0f/s)", ms(s.wrk.P99), ms(s.fixedP99), s.fixedRate)
			if t.scenario.h2 {
				p99s = "– –" // h2load measures no percentile, and no fixed-rate run
			}
			fmt.Fprintf(w, "%d %s %s %.0f %.1f %.1f %s %d %s\n", set, t.scenario.name, t.proxy, s.wrk.PerSecond,
				s.proxyCPU*1e6, (s.proxyCPU+s.originCPU)*1e6, p99s, s.wrk.Non2xx, s.loadAverage)
		}
	}
	checks, err := checkAfter(ctx, targets, res.Samples)
	res.Checks = append(res.Checks, checks...)
	if err != nil {
		return res, err
	}
	for _, c := range res.Checks {
		fmt.Fprintln(w, "# checked:", c)
	}
	fmt.Fprintln(w)
	res.print(w, cfg)
	return res, nil
}

// picked are the scenarios cfg runs, in the table's order.
func (c RequestsConfig) picked() []scenario {
	if len(c.Scenarios) == 0 {
		return scenarios
	}
	return slices.DeleteFunc(slices.Clone(scenarios), func(sc scenario) bool { return !slices.Contains(c.Scenarios, sc.name) })
}

func rotate(s []string, by int) []string {
	by %= len(s)
	return append(append([]string{}, s[by:]...), s[:by]...)
}

// startTarget starts proxy p configured for sc in front of origin.
func startTarget(ctx context.Context, cfg RequestsConfig, dir string, sc scenario, p, origin string, cert *benchCert) (*target, error) {
	t := &target{scenario: sc, proxy: p, cert: cert}
	name := p + "-" + sc.name
	var tlsAddr string
	if sc.tls {
		a, err := ports(1)
		if err != nil {
			return nil, err
		}
		tlsAddr = a[0]
	}
	var err error
	switch p {
	case "edge":
		var extra []string
		if sc.accessLog {
			t.log = filepath.Join(dir, name+".access.log")
			extra = append(extra, "--access-log", t.log, "--access-log-format", "json")
		}
		if sc.rate > 0 {
			f, err := writePeerFile(dir, "edge-"+sc.name+".yaml")
			if err != nil {
				return nil, err
			}
			extra = append(extra, "--rules", f)
		}
		if sc.name == "shed" {
			f, err := writePeerFile(dir, "edge-shed.json")
			if err != nil {
				return nil, err
			}
			// Two workers, both held by requests the origin never answers:
			// utilization stays at 1 and the ramp sheds every read.
			extra = append(extra, "--shedder", f, "--workers", "2", "--origin-header-timeout", "1h")
		}
		if sc.tls {
			extra = append(extra, "--listen-tls", tlsAddr, "--tls-default-cert", cert.pemFile)
		}
		t.srv, err = startEdgeAs(ctx, name, cfg.EdgeBin, dir, origin, extra...)
		if err == nil && sc.name == "shed" {
			t.holds, err = holdWorkers(ctx, t.srv, 2)
		}
	case "nginx":
		t.srv, err = startNginxAs(ctx, name, cfg.NginxBin, dir, func(nd, listen, who string) ([]byte, error) {
			pc := peerConf{Dir: nd, Origin: origin, Listen: listen, Who: who, Rate: sc.rate, Burst: sc.burst}
			if sc.tls {
				pc.TLSListen, pc.Cert, pc.H2 = tlsAddr, cert.pemFile, sc.h2
			}
			if sc.accessLog {
				t.log = filepath.Join(nd, "access.log")
				pc.AccessLog = t.log
			}
			return renderPeer("nginx.conf.tmpl", pc)
		})
	case "haproxy":
		pc := peerConf{Origin: origin, Rate: sc.rate, Burst: sc.burst}
		if sc.tls {
			pc.TLSListen, pc.Cert, pc.H2 = tlsAddr, cert.pemFile, sc.h2
		}
		if sc.accessLog {
			pc.AccessLog = "stdout"
			t.log = filepath.Join(dir, name+".access.log")
		}
		t.srv, err = startHAProxy(ctx, name, cfg.HAProxyBin, dir, pc)
	default:
		err = fmt.Errorf("unknown proxy %q", p)
	}
	if err != nil {
		return nil, err
	}
	t.addr = t.srv.addr
	if sc.tls {
		t.addr = tlsAddr
	}
	return t, nil
}

func renderPeer(name string, pc peerConf) ([]byte, error) {
	var b bytes.Buffer
	if err := peerTemplates.ExecuteTemplate(&b, name, pc); err != nil {
		return nil, fmt.Errorf("filling in %s: %w", name, err)
	}
	return b.Bytes(), nil
}

// writePeerFile copies a file of peers/ into dir.
func writePeerFile(dir, name string) (string, error) {
	b, err := peerFiles.ReadFile("peers/" + name)
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, name)
	return f, os.WriteFile(f, b, 0o644)
}

// startHAProxy runs haproxy in the foreground (-db) from the template
// filled in for pc, its log (and access log, when pc asks for one) in
// dir/name.log.
func startHAProxy(ctx context.Context, name, bin, dir string, pc peerConf) (*server, error) {
	a, err := ports(1)
	if err != nil {
		return nil, err
	}
	pc.Listen = a[0]
	text, err := renderPeer("haproxy.cfg.tmpl", pc)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, bin, "-c", "-q", "-f", conf).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy refuses %s: %w\n%s", conf, err, out)
	}
	cmd := exec.Command(bin, "-db", "-f", conf)
	if pc.AccessLog != "" {
		f, err := os.Create(filepath.Join(dir, name+".access.log"))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.Stdout = f
	}
	return startServing(ctx, name, dir, cmd, a[0])
}

// holdWorkers sends n requests for /hold through the edge, which the
// origin never answers, and waits until the edge sheds a request by its
// ramp; the function it returns ends them.
func holdWorkers(ctx context.Context, edge *server, n int) (func(), error) {
	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: n}}
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(hctx, http.MethodGet, "http://"+edge.addr+"/hold", nil)
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	stop := func() { cancel(); wg.Wait(); c.CloseIdleConnections() }
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	err := proc.PollEvery(pctx, 20*time.Millisecond, "the edge shedding by its ramp", func(ctx context.Context) error {
		if n := shedByRamp(ctx, edge.admin); n < 1 {
			// A read offered while the workers are held moves the ramp's
			// view of offered traffic; it is answered 503 either way.
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+edge.addr+"/", nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			return errors.New("no request shed by the ramp yet")
		}
		return nil
	})
	if err != nil {
		stop()
		return nil, fmt.Errorf("%w; the edge's shedder metrics:\n%s", err, metricLines(ctx, edge.admin, "edgeguard_shedder_"))
	}
	return stop, nil
}

// shedByRamp is the edge's edgeguard_shedder_rejected_total{reason="ramp"}
// summed over tiers; -1 if it cannot be read.
func shedByRamp(ctx context.Context, admin string) float64 {
	var total float64
	found := false
	for _, line := range strings.Split(metricLines(ctx, admin, "edgeguard_shedder_rejected_total{"), "\n") {
		if !strings.Contains(line, `reason="ramp"`) {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
				total += v
				found = true
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

// measure runs the warm-up and the measured wrk run against t, reading
// the proxy's and the origin's CPU time around it, then the fixed-rate run
// at half the requests/s wrk reached.
func measure(ctx context.Context, cfg RequestsConfig, t *target, origin *server) (sample, error) {
	url := t.url("/")
	if t.scenario.h2 {
		return measureH2(ctx, cfg, t, origin)
	}
	if cfg.Warmup > 0 {
		if _, err := runWrk(ctx, cfg.WrkBin, url, cfg.Threads, cfg.Conns, cfg.Warmup); err != nil {
			return sample{}, err
		}
	}
	var s sample
	s.loadAverage = loadavg()
	p0, o0 := cpuSeconds(t.srv.pid()), cpuSeconds(origin.pid())
	r, err := runWrk(ctx, cfg.WrkBin, url, cfg.Threads, cfg.Conns, cfg.Duration)
	if err != nil {
		return s, err
	}
	p1, o1 := cpuSeconds(t.srv.pid()), cpuSeconds(origin.pid())
	if r.Requests < 1 {
		return s, errors.New("wrk completed no request")
	}
	s.wrk = r
	s.proxyCPU = (p1 - p0) / float64(r.Requests)
	if t.proxy == "origin" {
		s.proxyCPU = 0 // the floor: the origin's CPU is all there is
	}
	s.originCPU = (o1 - o0) / float64(r.Requests)
	if cfg.FixedDuration > 0 {
		s.fixedRate = r.PerSecond / 2
		s.fixedP99, err = fixedRate(ctx, t.addr, t.tlsConfig(), "/", s.fixedRate, cfg.Conns, cfg.FixedDuration)
		if err != nil {
			return s, fmt.Errorf("fixed rate: %w", err)
		}
	}
	return s, nil
}

// measureH2 is measure for the HTTP/2 scenario: h2load in wrk's place
// (an unmeasured run, then the measured one with the CPU read around it);
// no fixed-rate run.
func measureH2(ctx context.Context, cfg RequestsConfig, t *target, origin *server) (sample, error) {
	url := t.url("/")
	if cfg.Warmup > 0 {
		if _, err := runH2load(ctx, cfg.H2loadBin, url, cfg.H2Clients, cfg.H2Streams, cfg.Warmup); err != nil {
			return sample{}, err
		}
	}
	var s sample
	s.loadAverage = loadavg()
	p0, o0 := cpuSeconds(t.srv.pid()), cpuSeconds(origin.pid())
	r, err := runH2load(ctx, cfg.H2loadBin, url, cfg.H2Clients, cfg.H2Streams, cfg.Duration)
	if err != nil {
		return s, err
	}
	p1, o1 := cpuSeconds(t.srv.pid()), cpuSeconds(origin.pid())
	if r.Requests < 1 {
		return s, errors.New("h2load completed no request")
	}
	s.wrk = r
	s.proxyCPU = (p1 - p0) / float64(r.Requests)
	s.originCPU = (o1 - o0) / float64(r.Requests)
	return s, nil
}

// checkWrk fails a run whose answers were not the scenario's: a proxied
// scenario with any error or non-2xx answer, a refusing one with fewer
// than 90 % refused (the denied scenario's limit admits one request in
// 100 ms), any with socket errors.
func checkWrk(t *target, r wrkResult) error {
	if r.SocketErrors > 0 {
		return fmt.Errorf("%d socket errors in %d requests", r.SocketErrors, r.Requests)
	}
	if t.scenario.status == http.StatusOK && r.Non2xx > 0 {
		return fmt.Errorf("%d of %d requests not answered 2xx/3xx", r.Non2xx, r.Requests)
	}
	if t.scenario.status != http.StatusOK && float64(r.Non2xx) < 0.9*float64(r.Requests) {
		return fmt.Errorf("only %d of %d requests refused, want at least 90 %% answered %d", r.Non2xx, r.Requests, t.scenario.status)
	}
	return nil
}

// spoofed are client fields no proxy may pass on as they came.
var spoofed = map[string]string{
	"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9", "True-Client-IP": "203.0.113.9",
	"X-Client-IP": "203.0.113.9", "CF-Connecting-IP": "203.0.113.9", "X-Cluster-Client-IP": "203.0.113.9",
	"Forwarded": "for=203.0.113.9", "X-Forwarded-Proto": "gopher", "X-Forwarded-Host": "spoofed.example",
	"X-Request-ID": "spoofed-id",
}

// checkForwarding sends /echo with every spoofed field through t and
// checks what the origin received: the proxy's own forwarding fields, none
// of the client's.
func checkForwarding(ctx context.Context, t *target) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.url("/echo"), nil)
	req.Host = "bench.example"
	for k, v := range spoofed {
		req.Header.Set(k, v)
	}
	// Over HTTP/2 in the h2 scenario (a custom TLS configuration turns
	// net/http's client's HTTP/2 off unless asked for).
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: t.tlsConfig(), ForceAttemptHTTP2: t.scenario.h2}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	want := 1
	if t.scenario.h2 {
		want = 2
	}
	if resp.ProtoMajor != want {
		return fmt.Errorf("/echo: answered over %s, want HTTP/%d", resp.Proto, want)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/echo: status %d: %s", resp.StatusCode, body)
	}
	var seen map[string]string
	if err := json.Unmarshal(body, &seen); err != nil {
		return fmt.Errorf("/echo: %w: %s", err, body)
	}
	proto := "http"
	if t.scenario.tls {
		proto = "https"
	}
	return forwardingProblems(seen, proto)
}

// forwardingProblems lists, at once, what the origin received that it
// should not have (seen: the fields as the origin got them). The request id
// is checked at the origin only: the edge does not send it back to the
// client (nginx's and HAProxy's configurations do).
func forwardingProblems(seen map[string]string, proto string) error {
	var errs []error
	want := map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": proto, "X-Forwarded-Host": "bench.example"}
	for k, v := range want {
		if seen[k] != v {
			errs = append(errs, fmt.Errorf("origin got %s %q, want %q", k, seen[k], v))
		}
	}
	if f := strings.ToLower(seen["Forwarded"]); !strings.Contains(f, "for=127.0.0.1") || !strings.Contains(f, "proto="+proto) || strings.Contains(f, "203.0.113.9") {
		errs = append(errs, fmt.Errorf("origin got Forwarded %q, want the proxy's for=127.0.0.1 and proto=%s only", seen["Forwarded"], proto))
	}
	for _, k := range []string{"X-Real-IP", "True-Client-IP", "X-Client-IP", "CF-Connecting-IP", "X-Cluster-Client-IP"} {
		if v, ok := seen[k]; ok {
			errs = append(errs, fmt.Errorf("origin got the client's %s %q", k, v))
		}
	}
	if id := seen["X-Request-ID"]; id == "" || id == spoofed["X-Request-ID"] {
		errs = append(errs, fmt.Errorf("origin got X-Request-ID %q, want one of the proxy's", id))
	}
	return errors.Join(errs...)
}

// checkAfter checks what the figures cannot show: the refusing scenarios'
// answers (status, the edge's RateLimit and Retry-After fields, the ramp
// counting the edge's 503s) and the access logs (a JSON line per request).
func checkAfter(ctx context.Context, targets map[string]*target, samples map[string][]sample) ([]string, error) {
	var checks []string
	for _, key := range sortedKeys(targets) {
		t := targets[key]
		switch t.scenario.name {
		case "denied":
			h, err := statusOf(ctx, t.srv.addr, http.StatusTooManyRequests)
			if err != nil {
				return checks, fmt.Errorf("%s: %w", key, err)
			}
			if t.proxy == "edge" {
				for _, f := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
					if h.Get(f) == "" {
						return checks, fmt.Errorf("%s: the 429 has no %s field", key, f)
					}
				}
				checks = append(checks, fmt.Sprintf("%s: 429 with RateLimit %q, RateLimit-Policy %q, Retry-After %q", key, h.Get("RateLimit"), h.Get("RateLimit-Policy"), h.Get("Retry-After")))
			} else {
				checks = append(checks, key+": 429")
			}
		case "shed":
			h, err := statusOf(ctx, t.srv.addr, http.StatusServiceUnavailable)
			if err != nil {
				return checks, fmt.Errorf("%s: %w", key, err)
			}
			// Every measured request was refused (checkWrk); nine in ten at
			// least must be the ramp's, not the worker cap's.
			var measured int64
			for _, s := range samples[key] {
				measured += s.wrk.Requests
			}
			n := shedByRamp(ctx, t.srv.admin)
			if n < 0.9*float64(measured) {
				return checks, fmt.Errorf("%s: the ramp shed %.0f requests, fewer than 90 %% of the %d measured:\n%s", key, n, measured, metricLines(ctx, t.srv.admin, "edgeguard_shedder_"))
			}
			checks = append(checks, fmt.Sprintf("%s: 503 with Retry-After %q; shed by the ramp: %.0f (wrk's measured requests: %d)", key, h.Get("Retry-After"), n, measured))
		}
		if t.log != "" {
			var measured int64
			for _, s := range samples[key] {
				measured += s.wrk.Requests
			}
			n, err := accessLogLines(ctx, t.log, measured)
			if err != nil {
				return checks, fmt.Errorf("%s: access log: %w", key, err)
			}
			checks = append(checks, fmt.Sprintf("%s: access log of %d JSON lines (wrk's measured requests: %d)", key, n, measured))
		}
	}
	return checks, nil
}

// statusOf GETs / from addr up to 20 times in a row until one is answered
// status (a limit of 10/s admits one in 100 ms: the first may pass); it
// returns that response's header.
func statusOf(ctx context.Context, addr string, status int) (http.Header, error) {
	var got []int
	for range 20 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == status {
			return resp.Header, nil
		}
		got = append(got, resp.StatusCode)
	}
	return nil, fmt.Errorf("GET / answered %v, never %d", got, status)
}

// accessLogLines waits until the access log at path holds at least want
// lines (every request wrk counted, warm-up and fixed-rate requests besides)
// and checks that each is a JSON object with a status; it returns the
// number of lines.
func accessLogLines(ctx context.Context, path string, want int64) (int64, error) {
	var n int64
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := proc.PollEvery(ctx, 50*time.Millisecond, "an access log line", func(context.Context) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		n = 0
		sc := bufio.NewScanner(f)
		// A full run's logs hold millions of lines: each is checked to be
		// JSON with a status field without decoding it.
		for sc.Scan() {
			if !json.Valid(sc.Bytes()) || sc.Bytes()[0] != '{' {
				return proc.Permanent(fmt.Errorf("line %d is not a JSON object: %s", n+1, sc.Bytes()))
			}
			if !bytes.Contains(sc.Bytes(), []byte(`"status":`)) {
				return proc.Permanent(fmt.Errorf("line %d has no status: %s", n+1, sc.Bytes()))
			}
			n++
		}
		if err := sc.Err(); err != nil {
			return err
		}
		if n == 0 || n < want {
			return fmt.Errorf("%d lines, want at least %d", n, want)
		}
		return nil
	})
	return n, err
}

// tlsConfig is the client side of t's TLS scenario (trusting the bench
// certificate), else nil.
func (t *target) tlsConfig() *tls.Config {
	if t.scenario.tls {
		return t.cert.clientTLS()
	}
	return nil
}
