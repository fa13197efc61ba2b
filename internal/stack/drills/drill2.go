package drills

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/stack"
	"github.com/edgeguard/edgeguard/internal/stack/resolver"
)

// dnsBound is how long a drained edge may stay in DNS answers: the Consul
// check interval (2 s) + the prepared query's TTL (0 s) + 1 s.
const dnsBound = 3 * time.Second

// Drill2 drains every edge of from (SIGTERM) while clients follow DNS at
// from's Consul: the answers move to to's edges within dnsBound, and to's
// capacity-limited origin makes its edges shed the lower tiers while the
// critical tier keeps ≥ 99.9% success, at the default shedder settings.
func (e *Env) Drill2(ctx context.Context, from, to string) *Result {
	r := newResult(fmt.Sprintf("2 every %s edge drained", from))
	r.Err = e.drill2(ctx, from, to, r)
	return r
}

func (e *Env) drill2(ctx context.Context, from, to string, res *Result) error {
	src, err := e.region(from)
	if err != nil {
		return err
	}
	dst, err := e.region(to)
	if err != nil {
		return err
	}
	dns, err := resolver.New(src.Consul.DNS)
	if err != nil {
		return err
	}
	var dstAddrs []netip.Addr
	for _, ed := range dst.Edges() {
		dstAddrs = append(dstAddrs, netip.MustParseAddr(ed.Addr))
	}
	// to's edges run the default shedder settings: the ramp sheds nothing
	// in this drill's 20 s, so the worker cap and its queue (ordered by
	// tier; critical requests wait up to critical_queue_timeout in places
	// of their own) are what keep the critical tier served.

	// The shed counters are cumulative: what this drill shed is the rise.
	shedBefore, err := shedOver(ctx, dst)
	if err != nil {
		return err
	}

	// Clients follow DNS at from's Consul, re-resolving every 250 ms.
	edges := src.Edges()
	if len(edges) == 0 {
		return fmt.Errorf("region %s has no edges", from)
	}
	port, err := edgePort(edges[0])
	if err != nil {
		return err
	}
	follow := &dnsTargets{dns: dns, query: e.Out.DNSQuery, port: port}
	if err := follow.refresh(ctx); err != nil {
		return err
	}
	go follow.loop(ctx)
	prefix := fmt.Sprintf("10.%d", rand.IntN(250)+1)
	critical := &load{Clients: clientIPs(prefix+".1", 4), Rate: 10, Path: "/checkout", Priority: "critical", Targets: follow.get}
	read := &load{Clients: clientIPs(prefix+".2", 30), Rate: 16, Path: "/catalog", Priority: "read", Targets: follow.get}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	wg.Go(func() { critical.run(loadCtx) })
	wg.Go(func() { read.run(loadCtx) })
	time.Sleep(2 * time.Second)

	// Event: drain every edge of from.
	drainedAt := time.Now()
	var pids []int
	for _, ed := range src.Edges() {
		pid, err := e.signalProc(stack.EdgeID(ed.Name), "edge", syscall.SIGTERM)
		if err != nil {
			stopLoad()
			wg.Wait()
			return err
		}
		pids = append(pids, pid)
	}
	defer func() {
		if err := e.reconcile(context.WithoutCancel(ctx)); err != nil {
			res.note("restoring the stack: %v", err)
		}
	}()
	// Witness: they report draining.
	for _, ed := range src.Edges() {
		if _, err := waitFor(ctx, 2*time.Second, ed.Name+" to report draining", func(ctx context.Context) error {
			if c := status(ctx, ed.Admin+"/readyz"); c != http.StatusServiceUnavailable {
				return fmt.Errorf("/readyz %d", c)
			}
			return nil
		}); err != nil {
			stopLoad()
			wg.Wait()
			return err
		}
	}
	// Outcome: DNS at from answers to's edges within the bound.
	_, err = waitFor(ctx, 15*time.Second, "DNS at "+from+" to answer "+to+"'s edges", func(ctx context.Context) error {
		got, err := dns.Lookup(ctx, e.Out.DNSQuery)
		if err != nil {
			return err
		}
		if !slices.Equal(got, dstAddrs) {
			return fmt.Errorf("answers %v", got)
		}
		return nil
	})
	moved := time.Since(drainedAt)
	res.Times["dns_failover"] = moved
	if err != nil {
		stopLoad()
		wg.Wait()
		return err
	}

	// Overload to's origin for a while.
	time.Sleep(20 * time.Second)
	stopLoad()
	wg.Wait()
	for _, pid := range pids {
		if !gone(pid) {
			res.note("drained edge pid %d still running after the load", pid)
		}
	}

	shedAfter, err := shedOver(ctx, dst)
	if err != nil {
		return err
	}
	shed := shedAfter - shedBefore
	cs, rs := critical.summary(), read.summary()
	for k, v := range cs {
		res.Counts["critical_"+k] = v
	}
	for k, v := range rs {
		res.Counts["read_"+k] = v
	}
	res.Counts["edge_shed"] = int(shed)

	var errs []error
	if moved > dnsBound {
		errs = append(errs, fmt.Errorf("DNS moved to %s after %s, want ≤ %s", to, moved.Round(time.Millisecond), dnsBound))
	}
	// Witness of the overload: the lower tier was shed.
	if rs["503"] == 0 || shed == 0 {
		errs = append(errs, fmt.Errorf("no read request was shed (client 503s %d, edge shed counters %.0f): the origin was not overloaded", rs["503"], shed))
	}
	total := 0
	for _, v := range cs {
		total += v
	}
	if total == 0 {
		errs = append(errs, errors.New("no critical request was sent"))
	} else {
		success := float64(cs["2xx"]) / float64(total)
		res.Counts["critical_success_permille"] = int(success * 1000)
		if success < 0.999 {
			errs = append(errs, fmt.Errorf("critical success %.4f < 0.999 (%v)", success, cs))
		}
	}
	if n := cs["errors"] + rs["errors"]; n > 0 {
		errs = append(errs, fmt.Errorf("%d transport errors for clients following DNS", n))
	}
	return errors.Join(errs...)
}

// dnsTargets keeps the edges DNS answers, refreshed every 250 ms as a
// client with a TTL-0 resolver would.
type dnsTargets struct {
	dns   *resolver.Resolver
	query string
	port  string // the edges' public port (DNS answers addresses only)
	mu    sync.Mutex
	urls  []string
}

// edgePort is the public port of ed (every edge listens on the same one,
// each on its own address).
func edgePort(ed stack.Edge) (string, error) {
	u, err := url.Parse(ed.URL)
	if err != nil || u.Port() == "" {
		return "", fmt.Errorf("edge %s: no port in its url %q", ed.Name, ed.URL)
	}
	return u.Port(), nil
}

func (d *dnsTargets) refresh(ctx context.Context) error {
	addrs, err := d.dns.Lookup(ctx, d.query)
	if err != nil {
		return err
	}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "http://" + net.JoinHostPort(a.String(), d.port)
	}
	d.mu.Lock()
	d.urls = urls
	d.mu.Unlock()
	return nil
}

func (d *dnsTargets) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
			_ = d.refresh(ctx)
		}
	}
}

func (d *dnsTargets) get() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.urls)
}

// shedOver sums edgeguard_shedder_rejected_total{tier,reason} (every request
// turned away: ramp, queue_full, queue_timeout) over the region's edges.
func shedOver(ctx context.Context, r stack.Region) (float64, error) {
	return sumOverEdges(ctx, r.Edges(), "edgeguard_shedder_rejected_total")
}
