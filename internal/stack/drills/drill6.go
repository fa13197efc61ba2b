package drills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/faults"
	"github.com/edgeguard/edgeguard/internal/stack"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// globalRuleID is the stack's global rule (rules.yaml), keyed by X-Client
// on /global.
const globalRuleID = "drill-global"

// Drill6 runs the stack's global rule (scope: global) over both regions,
// the Cluster region reaching the Sentinel region's Redis over a WAN-like
// link (a proxy run here adding 40–74 ms each way, 80–148 ms round trip,
// which that region's catalog points the home at). First the Cluster
// region joins the link (witness: cut off once, its edges decide from the
// static share, then settle over the link). Then the link is cut
// (black-holed): the cut-off region decides from its static share (metric
// and regions status), the window admits at most L·(1+t) plus that share;
// the link heals and the share's debts are paid once. Then roaming clients
// flooding every edge of both regions get one quota, L·(1+t) at most, and
// the global rule's request p99 stays within a margin of a region rule's
// on the same edges; a client under its limit alternating regions is
// (almost) never denied. Keys homed in the Cluster region reach it without
// the link (a Cluster's clients follow the slot map to the nodes' own
// addresses).
func (e *Env) Drill6(ctx context.Context) *Result {
	r := newResult("6 global rule across regions")
	r.Err = e.drill6(ctx, r)
	return r
}

// wanToxics make the link between regions WAN-like: 57 ± 17 ms each way.
var wanToxics = []faults.Toxic{
	{Name: "wan-up", Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 57, "jitter": 17}},
	{Name: "wan-down", Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 57, "jitter": 17}},
}

// blackHole holds every byte sent over the link, answering nothing.
var blackHole = faults.Toxic{Name: "partition", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}

// globalDrill is what the drill knows of the stack and its rule.
type globalDrill struct {
	e      *Env
	snap   *rules.Snapshot
	rule   rules.CompiledRule
	names  []string
	edges  []stack.Edge // both regions, interleaved
	region map[string]string
	runID  string
	// home is the Sentinel region, whose keys the other region (away)
	// reaches over link.
	home, away string
	link       *faults.Net
}

func (e *Env) drill6(ctx context.Context, res *Result) error {
	g, err := e.newGlobalDrill()
	if err != nil {
		return err
	}
	L, t := g.rule.Limit, g.rule.Tolerance
	bound := int(math.Floor(float64(L) * (1 + t)))
	// Each phase counts its own key, so a phase must not straddle a
	// window boundary: wait for the next window if this one ends soon.
	if left := g.rule.Window - time.Duration(time.Now().UnixNano())%g.rule.Window; left < 30*time.Second {
		fmt.Fprintf(e.Log, "drill 6: waiting %s for the next window\n", left.Round(time.Second))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(left):
		}
	}

	// 1. The link: the Sentinel region's Redis, as the other region's
	// catalog names it, is a proxy with the WAN's latency.
	restored := false
	defer func() {
		if !restored {
			_ = e.pushStackCatalog(context.WithoutCancel(ctx))
		}
	}()
	if err := g.joinWAN(ctx, res); err != nil {
		return err
	}
	defer g.link.Close()

	// 2. Partition and heal.
	if err := g.partition(ctx, res, bound); err != nil {
		return err
	}

	// 3. Roaming clients: 8 at a time, round-robin over every edge of both
	// regions, 3 × L requests of one key homed across the link; as many
	// requests of a region rule (api-key, a key per 16 requests: none
	// denied) on the same edges at the same time, for the latencies.
	key, err := g.clientHomed("roam", g.home)
	if err != nil {
		return err
	}
	var (
		wg             sync.WaitGroup
		roam, regional *tally
		gerr, rerr     error
	)
	wg.Go(func() { roam, gerr = g.drive(ctx, key, g.edges, 8, 3*int(L), nil) })
	wg.Go(func() {
		regional, rerr = g.send(ctx, func(i int) target {
			return target{path: "/api", header: "X-API-Key", value: fmt.Sprintf("api-%s-%d", g.runID, i%16), ip: fmt.Sprintf("198.51.100.%d", 101+i%8)}
		}, g.edges, 8, 3*int(L), nil)
	})
	wg.Wait()
	if err := errors.Join(gerr, rerr); err != nil {
		return err
	}
	res.Counts["roaming_admitted"] = roam.admitted()
	res.Counts["roaming_bound"] = bound
	fmt.Fprintf(e.Log, "drill 6: roaming: %s (limit %d, bound %d)\n", roam, L, bound)
	if roam.admitted() > bound {
		return fmt.Errorf("roaming clients: %d admitted over both regions, above L·(1+t) = %d (%s)", roam.admitted(), bound, roam)
	}
	if float64(roam.admitted()) < float64(L)*(1-t) {
		return fmt.Errorf("roaming clients: %d admitted, quota stranded (limit %d)", roam.admitted(), L)
	}
	for reg, n := range roam.byRegion() {
		if n == 0 {
			return fmt.Errorf("roaming clients: nothing admitted in %s: not spread over both regions (%s)", reg, roam)
		}
	}
	if err := g.homeCounted(ctx, key, roam.admitted(), int(math.Floor(float64(L)*t/2))); err != nil {
		return err
	}
	if err := g.compareLatency(res, roam, regional); err != nil {
		return err
	}

	// 4. One client under its limit (0.9 × L over about 15 s), alternating
	// regions request by request, homed across the link: its quota would
	// last 16.7 s, well above 2·RTT/t (5.9 s at the link's 148 ms worst
	// round trip), so the lease keeps ahead of it (docs/guarantees.md).
	key, err = g.clientHomed("steady", g.home)
	if err != nil {
		return err
	}
	n := int(float64(L) * 0.9)
	pace := 15 * time.Second / time.Duration(n)
	steady, err := g.drive(ctx, key, g.edges, 1, n, time.NewTicker(pace))
	if err != nil {
		return err
	}
	late, lateDenied := steady.after(time.Second)
	res.Counts["steady_sent"] = n
	res.Counts["steady_denied_after_1s"] = lateDenied
	fmt.Fprintf(e.Log, "drill 6: under-limit client: %s; %d of the %d sent after the first second denied\n", steady, lateDenied, late)
	if float64(lateDenied) > 0.01*float64(late) {
		return fmt.Errorf("under-limit client: %d of %d requests after the first second denied (more than 1 %%)", lateDenied, late)
	}

	// Restore: the stack's catalog in the cut-off region again.
	restored = true
	return e.pushStackCatalog(ctx)
}

// compareLatency checks that a global rule's admitted requests are about
// as fast as a region rule's on the edges of the region leasing across
// the link: what an edge decides from its allowance or overdraft never
// waits on the link. A request that did wait would take a round trip of
// the link, 80 ms at least: the p99s may differ by the larger of 40 ms
// and half the region rule's p99 (the machine's noise), not more. The
// home region's and both regions' p99s are reported, not asserted: there
// the global rule is a leased check on the region's own Redis, whose
// carves for the one flooded key queue behind each other, link or not.
func (g *globalDrill) compareLatency(res *Result, global, regional *tally) error {
	for _, reg := range []string{g.away, g.home, ""} {
		gp, gn := global.p99(reg)
		rp, rn := regional.p99(reg)
		where := reg
		if where == "" {
			where = "both regions"
		}
		fmt.Fprintf(g.e.Log, "drill 6: p99 of admitted requests on %s: global rule %s (%d), region rule %s (%d)\n", where, gp.Round(100*time.Microsecond), gn, rp.Round(100*time.Microsecond), rn)
		if reg != g.away {
			continue
		}
		res.Times["p99_global_"+reg], res.Times["p99_region_"+reg] = gp, rp
		if gn < 20 || rn < 20 {
			return fmt.Errorf("latency on %s: %d and %d admitted requests, too few for a p99", where, gn, rn)
		}
		if margin := max(40*time.Millisecond, rp/2); gp > rp+margin {
			return fmt.Errorf("latency on %s: global rule p99 %s above the region rule's %s + %s", where, gp, rp, margin)
		}
	}
	return nil
}

// joinWAN starts the link to the home's Sentinel master and points the
// away region's catalog at it, then waits for every edge of the away
// region to reach the home through it: the link starts cut, so that an
// edge still on the direct address cannot pass for one on the link; each
// edge, asked for a key of the home, marks the home unreachable (which
// only the link can make it do), then the link carries, with the WAN's
// latency, and every edge is back on the home with no debt.
func (g *globalDrill) joinWAN(ctx context.Context, res *Result) error {
	e := g.e
	home, homeRegion, err := e.regionOfMode("sentinel")
	if err != nil {
		return err
	}
	g.home = home
	for _, name := range g.names {
		if name != home {
			g.away = name
			break
		}
	}
	master, err := sentinelMaster(ctx, homeRegion)
	if err != nil {
		return err
	}
	g.link = faults.NewNet()
	proxied, err := g.link.Listen(master)
	if err != nil {
		g.link.Close()
		return err
	}
	for _, tx := range append(wanToxics, blackHole) {
		if err := g.link.Add(tx); err != nil {
			g.link.Close()
			return err
		}
	}
	cat, err := e.stackCatalog()
	if err != nil {
		g.link.Close()
		return err
	}
	for i, r := range cat.Regions {
		if r.Name == home {
			cat.Regions[i] = region.CatalogRegion{Name: home, Redis: "redis://" + proxied, RedisMode: "standalone"}
		}
	}
	rc, err := region.NewClient(&api.Config{Address: strings.TrimPrefix(e.Out.Regions[g.away].Consul.HTTP, "http://")}, "")
	if err != nil {
		g.link.Close()
		return err
	}
	start := time.Now()
	if err := rc.PutCatalog(ctx, g.away, cat); err != nil {
		g.link.Close()
		return err
	}
	probe, err := g.clientHomed("probe", home)
	if err != nil {
		g.link.Close()
		return err
	}
	if err := g.cutOff(ctx, probe, nil); err != nil {
		g.link.Close()
		return err
	}
	if err := g.heal(ctx); err != nil {
		g.link.Close()
		return err
	}
	res.Times["wan_joined"] = time.Since(start)
	fmt.Fprintf(e.Log, "drill 6: %s reaches %s's Redis over the link (%s)\n", g.away, home, res.Times["wan_joined"].Round(time.Millisecond))
	return nil
}

// cutOff waits until every edge of the away region, asked for client (a
// key of the home), decides the home's keys from the static share; the
// replies go to all when it is set.
func (g *globalDrill) cutOff(ctx context.Context, client string, all *tally) error {
	return eachEdge(ctx, g.e.Out.Regions[g.away].Edges(), 20*time.Second, "deciding "+g.home+"'s keys from the static share", func(ctx context.Context, ed stack.Edge) error {
		code, _, err := get(ctx, ed.URL, globalTarget(client, "198.51.100.200"))
		if err != nil {
			return err
		}
		if all != nil {
			all.replies = append(all.replies, reply{region: g.away, status: code})
		}
		v, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_fallback_share", g.home)
		if err == nil && v != 1 {
			err = fmt.Errorf("fallback_share %v", v)
		}
		return err
	})
}

// heal lifts the black hole (the WAN's latency stays) and waits until
// every edge of the away region is back on the home with no debt.
func (g *globalDrill) heal(ctx context.Context) error {
	g.link.Clear()
	for _, tx := range wanToxics {
		if err := g.link.Add(tx); err != nil {
			return err
		}
	}
	return eachEdge(ctx, g.e.Out.Regions[g.away].Edges(), 20*time.Second, "back on "+g.home+" with no debt", func(ctx context.Context, ed stack.Edge) error {
		fs, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_fallback_share", g.home)
		if err != nil {
			return err
		}
		debt, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_debt_units", g.home)
		if err != nil {
			return err
		}
		if fs != 0 || debt != 0 {
			return fmt.Errorf("fallback_share %v, debt %v", fs, debt)
		}
		return nil
	})
}

func (e *Env) newGlobalDrill() (*globalDrill, error) {
	data, err := os.ReadFile(e.RulesFile())
	if err != nil {
		return nil, err
	}
	doc, err := rules.Parse(data)
	if err != nil {
		return nil, err
	}
	names := sortedNames(e.Out.Regions)
	if len(names) < 2 {
		return nil, errors.New("drill 6 needs two regions")
	}
	salt := e.Out.Regions[names[0]].KeySalt
	g := &globalDrill{e: e, names: names, region: map[string]string{}, runID: strconv.FormatInt(time.Now().UnixNano(), 36)}
	for _, name := range names {
		if s := e.Out.Regions[name].KeySalt; s != salt {
			return nil, fmt.Errorf("regions %s and %s have different key salts: a global rule's key differs between them", names[0], name)
		}
	}
	if g.snap, err = rules.Compile(doc, rules.WithKeySalt([]byte(salt))); err != nil {
		return nil, err
	}
	found := false
	for _, r := range g.snap.Rules() {
		if r.ID == globalRuleID {
			g.rule, found = r, true
		}
	}
	if !found || g.rule.Scope != rules.ScopeGlobal {
		return nil, fmt.Errorf("%s: no global rule %q", e.RulesFile(), globalRuleID)
	}
	// Interleave the regions' edges so consecutive requests change region.
	lists := map[string][]stack.Edge{}
	longest := 0
	for _, name := range names {
		lists[name] = e.Out.Regions[name].Edges()
		longest = max(longest, len(lists[name]))
		for _, ed := range lists[name] {
			g.region[ed.URL] = name
		}
	}
	for i := range longest {
		for _, name := range names {
			if i < len(lists[name]) {
				g.edges = append(g.edges, lists[name][i])
			}
		}
	}
	return g, nil
}

// key is the rule's counter key for a client, as every edge computes it.
func (g *globalDrill) key(client string) (string, error) {
	req := &rules.Request{Method: http.MethodGet, Path: "/global", ClientIP: netip.MustParseAddr("192.0.2.1"),
		Header: func(name string) (string, bool) { return client, name == "X-Client" }}
	for _, m := range g.snap.Match(req, nil) {
		if m.Rule.ID == globalRuleID {
			return m.Key, nil
		}
	}
	return "", fmt.Errorf("rule %s does not match a request of %s", globalRuleID, client)
}

// homeOf is the client key's home region.
func (g *globalDrill) homeOf(client string) (string, error) {
	k, err := g.key(client)
	if err != nil {
		return "", err
	}
	return limiter.Home(g.names, k), nil
}

// clientHomed returns a new client name whose key is homed in region.
func (g *globalDrill) clientHomed(prefix, region string) (string, error) {
	for i := range 1000 {
		c := fmt.Sprintf("%s-%s-%d", prefix, g.runID, i)
		if h, err := g.homeOf(c); err != nil {
			return "", err
		} else if h == region {
			return c, nil
		}
	}
	return "", fmt.Errorf("no client key homed in %s", region)
}

// reply is one request's outcome.
type reply struct {
	at     time.Duration // since the phase started
	took   time.Duration // sent to answered
	region string
	status int
}

type tally struct{ replies []reply }

func (t *tally) admitted() int {
	n := 0
	for _, r := range t.replies {
		if r.status == http.StatusOK {
			n++
		}
	}
	return n
}

func (t *tally) byRegion() map[string]int {
	out := map[string]int{}
	for _, r := range t.replies {
		if _, ok := out[r.region]; !ok {
			out[r.region] = 0
		}
		if r.status == http.StatusOK {
			out[r.region]++
		}
	}
	return out
}

// after counts the replies after d and the denials among them.
func (t *tally) after(d time.Duration) (n, denied int) {
	for _, r := range t.replies {
		if r.at > d {
			n++
			if r.status != http.StatusOK {
				denied++
			}
		}
	}
	return n, denied
}

func (t *tally) String() string {
	codes := map[int]int{}
	for _, r := range t.replies {
		codes[r.status]++
	}
	return fmt.Sprintf("%d sent, %d admitted %v, statuses %v", len(t.replies), t.admitted(), t.byRegion(), codes)
}

// p99 is the 99th percentile of the admitted replies' latencies on
// region's edges (every edge when region is ""), and how many there were.
func (t *tally) p99(region string) (time.Duration, int) {
	var took []time.Duration
	for _, r := range t.replies {
		if r.status == http.StatusOK && (region == "" || r.region == region) {
			took = append(took, r.took)
		}
	}
	if len(took) == 0 {
		return 0, 0
	}
	slices.Sort(took)
	return took[(len(took)*99+99)/100-1], len(took)
}

var globalClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// target is one request: a path, the header naming the rule's key and
// the client address (X-Forwarded-For; the edges trust loopback).
type target struct{ path, header, value, ip string }

func globalTarget(client, ip string) target {
	return target{path: "/global", header: "X-Client", value: client, ip: ip}
}

// drive sends n requests of client over edges, round-robin, from
// workers at a time (each at tick's pace when tick is set).
func (g *globalDrill) drive(ctx context.Context, client string, edges []stack.Edge, workers, n int, tick *time.Ticker) (*tally, error) {
	return g.send(ctx, func(i int) target { return globalTarget(client, fmt.Sprintf("198.51.100.%d", 1+i%workers)) }, edges, workers, n, tick)
}

// send sends the n requests of to over edges, round-robin, from workers
// at a time (each at tick's pace when tick is set). A status other than
// 200 and 429 is an error: the tally would not say what the limiter
// decided.
func (g *globalDrill) send(ctx context.Context, to func(i int) target, edges []stack.Edge, workers, n int, tick *time.Ticker) (*tally, error) {
	if tick != nil {
		defer tick.Stop()
	}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		out   tally
		errs  []error
		wg    sync.WaitGroup
		start = time.Now()
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if tick != nil {
					<-tick.C
				}
				ed := edges[i%len(edges)]
				sent := time.Since(start)
				code, took, err := get(ctx, ed.URL, to(i))
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", ed.Name, err))
				} else {
					out.replies = append(out.replies, reply{at: sent, took: took, region: g.region[ed.URL], status: code})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return &out, fmt.Errorf("%d of %d requests failed: %w", len(errs), n, errors.Join(errs[:min(len(errs), 3)]...))
	}
	return &out, nil
}

// get sends one request to the edge at url and times it.
func get(ctx context.Context, url string, to target) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+to.path, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set(to.header, to.value)
	req.Header.Set("X-Forwarded-For", to.ip)
	start := time.Now()
	resp, err := globalClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	took := time.Since(start)
	resp.Body.Close()
	if err != nil {
		return resp.StatusCode, took, fmt.Errorf("GET %s: %w", to.path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return resp.StatusCode, took, fmt.Errorf("GET %s: %s", to.path, resp.Status)
	}
	return resp.StatusCode, took, nil
}

// homeCount reads the client's count in the current window from its
// home region's Redis.
func (g *globalDrill) homeCount(ctx context.Context, client string) (int64, string, error) {
	k, err := g.key(client)
	if err != nil {
		return 0, "", err
	}
	home := limiter.Home(g.names, k)
	r := g.e.Out.Regions[home]
	mode, err := limiter.ParseMode(r.Redis.Mode)
	if err != nil {
		return 0, home, err
	}
	c, err := limiter.NewRedisClient(r.Redis.URL, mode)
	if err != nil {
		return 0, home, err
	}
	defer c.Close()
	st, err := limiter.NewRedisStore(limiter.Conn(c), "")
	if err != nil {
		return 0, home, err
	}
	// Global keys are counted in their own namespace (g:) at the home.
	keys := st.Keys(limiter.Limit{Key: "g:" + k, Algorithm: g.rule.Algorithm})
	w := g.rule.Window.Milliseconds()
	ws := time.Now().UnixMilli() / w * w
	n, err := c.HGet(ctx, keys[0], strconv.FormatInt(ws, 10)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, home, nil
	}
	return n, home, err
}

// homeCounted waits until the home's count of client is at most what the
// clients saw admitted (allowance carved but not spent is given back
// once idle), then checks it is not below that by more than the
// overdraft, which a carve pays.
func (g *globalDrill) homeCounted(ctx context.Context, client string, admitted, overdraft int) error {
	var n int64
	var home string
	_, err := waitFor(ctx, 15*time.Second, "the home's count of "+client+" to be at most the admitted", func(ctx context.Context) error {
		var err error
		if n, home, err = g.homeCount(ctx, client); err != nil {
			return err
		}
		if n > int64(admitted) {
			return fmt.Errorf("%s counts %d, clients saw %d admitted", home, n, admitted)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.e.Log, "drill 6: %s's Redis counts %d for %s (admitted %d)\n", home, n, client, admitted)
	if n < int64(admitted-overdraft) {
		return fmt.Errorf("%s counts %d for %s, but %d were admitted (unpaid overdraft ≤ %d)", home, n, client, admitted, overdraft)
	}
	return nil
}

// sumGlobal sums a global-rule series for home over edges.
func sumGlobal(ctx context.Context, edges []stack.Edge, name, home string, extra ...string) (float64, error) {
	labels := map[string]string{"home": home}
	for i := 0; i+1 < len(extra); i += 2 {
		labels[extra[i]] = extra[i+1]
	}
	return sumOverEdges(ctx, edges, name, labels)
}

// eachEdge waits until cond holds for every edge.
func eachEdge(ctx context.Context, edges []stack.Edge, timeout time.Duration, what string, cond func(context.Context, stack.Edge) error) error {
	for _, ed := range edges {
		if _, err := waitFor(ctx, timeout, ed.Name+": "+what, func(ctx context.Context) error { return cond(ctx, ed) }); err != nil {
			return err
		}
	}
	return nil
}

func (g *globalDrill) partition(ctx context.Context, res *Result, bound int) error {
	e := g.e
	L := g.rule.Limit
	share := int(L) / len(g.names)
	home, away := g.home, g.away
	awayEdges := e.Out.Regions[away].Edges()
	client, err := g.clientHomed("cut", home)
	if err != nil {
		return err
	}
	before := map[string]float64{}
	for _, m := range []string{"share", "overdraft"} {
		if before[m], err = sumGlobal(ctx, awayEdges, "edgeguard_limiter_global_decisions_total", home, "from", m); err != nil {
			return err
		}
	}
	if before["settled"], err = sumGlobal(ctx, awayEdges, "edgeguard_limiter_global_settled_units_total", home); err != nil {
		return err
	}

	// Event: the link black-holes (every byte held, nothing answered).
	if err := g.link.Add(blackHole); err != nil {
		return err
	}
	cutAt := time.Now()
	var all tally
	// Witness: each cut-off edge, asked for the key (its carve hangs
	// until the deadline), marks the home unreachable.
	if err := g.cutOff(ctx, client, &all); err != nil {
		return err
	}
	res.Times["partition_noticed"] = time.Since(cutAt)
	if _, err := waitFor(ctx, 15*time.Second, "regions status to show the static share", func(ctx context.Context) error {
		out, _, err := e.regionctl(ctx, e.Out.Regions[away].Consul.HTTP, "regions", "status", "--region", away)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "global share for "+home) {
			return fmt.Errorf("regions status: %q", out)
		}
		return nil
	}); err != nil {
		return err
	}

	// Outcome: the cut-off region, flooded, admits its share (and the
	// overdraft); the home region's own clients go on (a third of L, so
	// that the window has room left for the debts when the link heals: a
	// debt is paid from what the home's window still has, and one the
	// window cannot pay ends with it); the window admits at most
	// L·(1+t) + the share.
	homeEdges := e.Out.Regions[home].Edges()
	var (
		wg            sync.WaitGroup
		flood, steady *tally
		ferr, serr    error
	)
	wg.Go(func() { flood, ferr = g.drive(ctx, client, awayEdges, 8, 3*share, nil) })
	wg.Go(func() { steady, serr = g.drive(ctx, client, homeEdges, 2, int(L)/3, nil) })
	wg.Wait()
	if err := errors.Join(ferr, serr); err != nil {
		return err
	}
	all.replies = append(all.replies, flood.replies...)
	all.replies = append(all.replies, steady.replies...)
	shareNow, err := sumGlobal(ctx, awayEdges, "edgeguard_limiter_global_decisions_total", home, "from", "share")
	if err != nil {
		return err
	}
	shareDecided := int(shareNow - before["share"])
	awayAdmitted := all.byRegion()[away]
	overdraft := int(math.Floor(float64(L) * g.rule.Tolerance / 2))
	res.Counts["partition_admitted"] = all.admitted()
	res.Counts["partition_bound"] = bound + share
	res.Counts["cut_off_admitted"] = awayAdmitted
	fmt.Fprintf(e.Log, "drill 6: partitioned: %s; %s decided %d checks from its share (share %d, bound %d)\n", &all, away, shareDecided, share, bound+share)
	if all.admitted() > bound+share {
		return fmt.Errorf("partitioned: %d admitted, above L·(1+t) + share = %d (%s)", all.admitted(), bound+share, &all)
	}
	if shareDecided <= 0 {
		return fmt.Errorf("partitioned: %s decided nothing from the static share", away)
	}
	// The key was new: the cut-off region held nothing of it, so it
	// admitted its share and the overdraft at most.
	if awayAdmitted > share+overdraft {
		return fmt.Errorf("partitioned: %s admitted %d, above its share %d + the overdraft %d", away, awayAdmitted, share, overdraft)
	}

	// Heal: the link carries again (with the WAN's latency); every
	// cut-off edge finds the home, pays its debts (share and overdraft)
	// once.
	healAt := time.Now()
	if err := g.heal(ctx); err != nil {
		return err
	}
	res.Times["healed"] = time.Since(healAt)
	settled, err := sumGlobal(ctx, awayEdges, "edgeguard_limiter_global_settled_units_total", home)
	if err != nil {
		return err
	}
	overNow, err := sumGlobal(ctx, awayEdges, "edgeguard_limiter_global_decisions_total", home, "from", "overdraft")
	if err != nil {
		return err
	}
	paid, over := int(settled-before["settled"]), int(overNow-before["overdraft"])
	res.Counts["settled"] = paid
	fmt.Fprintf(e.Log, "drill 6: healed in %s: settled %d for the %d %s admitted (%d overdraft decisions)\n", res.Times["healed"].Round(time.Millisecond), paid, awayAdmitted, away, over)
	// Everything the cut-off region admitted was debt (nothing carved);
	// each unit is paid once.
	if paid != awayAdmitted {
		return fmt.Errorf("healed: settled %d units for the %d %s admitted while cut off", paid, awayAdmitted, away)
	}
	// Nothing counted twice: the home counts at most what was admitted.
	if err := g.homeCounted(ctx, client, all.admitted(), int(math.Floor(float64(L)*g.rule.Tolerance/2))); err != nil {
		return err
	}
	return nil
}

// stackCatalog is the region catalog stackctl reconcile pushed.
func (e *Env) stackCatalog() (region.Catalog, error) {
	data, err := os.ReadFile(e.catalogFile())
	if err != nil {
		return region.Catalog{}, err
	}
	var c region.Catalog
	return c, json.Unmarshal(data, &c)
}

func (e *Env) catalogFile() string { return filepath.Join(e.Out.StateDir, "region-catalog.json") }

// pushStackCatalog writes the stack's catalog into every region again.
func (e *Env) pushStackCatalog(ctx context.Context) error {
	names := sortedNames(e.Out.Regions)
	out, code, err := e.regionctl(ctx, e.Out.Regions[names[0]].Consul.HTTP, "catalog", "push", e.catalogFile())
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("regionctl catalog push exited %d: %s", code, out)
	}
	return nil
}
