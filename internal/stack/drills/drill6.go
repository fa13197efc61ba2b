package drills

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
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
// each region reaching the other's Redis over a WAN-like link (proxies run
// here adding 40–74 ms each way, 80–148 ms round trip): the Cluster region
// reaches the Sentinel region's master through one proxy, which its
// catalog names as the home's Redis; the Sentinel region reaches every
// node of the Cluster through a proxy of its own, which its catalog maps
// the nodes' announced addresses to (dial), so its edges' Cluster client
// follows the real slot map across the link. First both regions join the
// links (witness: cut off once, their edges decide from the static share,
// then settle over the link). Then the link to the Sentinel region is cut
// (black-holed): the cut-off region decides from its static share (metric
// and regions status), the window admits at most L·(1+t) plus that share;
// the link heals and the share's debts are paid once. Then, in each
// direction, roaming clients flooding every edge of both regions with a
// key homed across the link get one quota, L·(1+t) at most, and the
// global rule's request p99 on the leasing region's edges stays within a
// margin of a region rule's on the same edges; a client under its limit
// alternating regions is (almost) never denied.
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
	// dirs are the two directions over the WAN: keys homed in the
	// Sentinel region leased from the Cluster region, then the reverse.
	dirs []*direction
}

// direction is one way over the WAN: away's edges reach home's Redis over
// link.
type direction struct {
	home, away string
	link       *faults.Net
}

func (d *direction) String() string { return d.away + " → " + d.home }

// close takes the direction's link down (nil-safe).
func (g *globalDrill) close() {
	for _, d := range g.dirs {
		if d.link != nil {
			d.link.Close()
		}
	}
}

func (e *Env) drill6(ctx context.Context, res *Result) error {
	g, err := e.newGlobalDrill()
	if err != nil {
		return err
	}
	L, t := g.rule.Limit, g.rule.Tolerance
	bound := int(math.Floor(float64(L) * (1 + t)))
	// Each phase counts its own key, so a phase must not straddle a
	// window boundary: wait for the next window if this one ends before
	// the drill (about a minute) would.
	if left := g.rule.Window - time.Duration(time.Now().UnixNano())%g.rule.Window; left < 90*time.Second {
		fmt.Fprintf(e.Log, "drill 6: waiting %s for the next window\n", left.Round(time.Second))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(left):
		}
	}

	// 1. The links: each region's Redis, as the other region's catalog
	// names it, is behind proxies with the WAN's latency.
	restored := false
	defer func() {
		if !restored {
			_ = e.pushStackCatalog(context.WithoutCancel(ctx))
		}
	}()
	if err := g.joinWAN(ctx, res); err != nil {
		return err
	}
	defer g.close()

	// 2. Partition and heal (the link to the Sentinel region).
	if err := g.partition(ctx, res, g.dirs[0], bound); err != nil {
		return err
	}

	// 3. Roaming clients, in each direction.
	for _, d := range g.dirs {
		if err := g.roaming(ctx, res, d, bound); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}

	// 4. One client under its limit (0.9 × L over about 15 s), alternating
	// regions request by request, homed across the link: its quota would
	// last 16.7 s, well above 2·RTT/t (5.9 s at the link's 148 ms worst
	// round trip), so the lease keeps ahead of it (docs/guarantees.md).
	// One such client per direction, at the same time.
	var (
		wg     sync.WaitGroup
		errs   = make([]error, len(g.dirs))
		denied = make([]int, len(g.dirs))
	)
	for i, d := range g.dirs {
		wg.Go(func() { denied[i], errs[i] = g.steady(ctx, d) })
	}
	wg.Wait()
	res.Counts["steady_sent"] = int(float64(L) * 0.9)
	for i, d := range g.dirs {
		res.Counts["steady_denied_after_1s_"+d.home] = denied[i]
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}

	// Restore: the stack's catalog in every region again.
	restored = true
	return e.pushStackCatalog(ctx)
}

// roaming: 8 clients at a time, round-robin over every edge of both
// regions, 3 × L requests of one key homed in d.home; as many requests of
// a region rule (api-key, a key per 16 requests: none denied) on the same
// edges at the same time, for the latencies.
//
// How many of the flooded key's requests the leasing region admits
// depends on how soon its edges lease across the link, which a busy
// machine delays: fewer than minLatencySamples states no p90. Another
// round then floods another key homed in d.home (every bound checked
// again, for that key) and its latencies join the first round's, up to
// maxRoamRounds rounds in all.
func (g *globalDrill) roaming(ctx context.Context, res *Result, d *direction, bound int) error {
	global, regional := &tally{}, &tally{}
	for round := range maxRoamRounds {
		roam, reg, err := g.roamOnce(ctx, res, d, bound, round)
		if err != nil {
			return err
		}
		global.replies = append(global.replies, roam.replies...)
		regional.replies = append(regional.replies, reg.replies...)
		err = g.compareLatency(res, d, global, regional)
		if !errors.Is(err, errFewSamples) || round == maxRoamRounds-1 {
			return err
		}
		fmt.Fprintf(g.e.Log, "drill 6: %s: %v; flooding another key homed in %s for more\n", d, err, d.home)
	}
	return nil
}

// maxRoamRounds bounds the rounds roaming floods for enough latencies.
const maxRoamRounds = 3

// errFewSamples: too few admitted requests to compare p90s on.
var errFewSamples = errors.New("too few for a p90")

// roamOnce is one round of roaming: the flood, its bounds, and the
// replies for the latencies. Round 0's counts are the result's.
func (g *globalDrill) roamOnce(ctx context.Context, res *Result, d *direction, bound, round int) (*tally, *tally, error) {
	e := g.e
	L, t := g.rule.Limit, g.rule.Tolerance
	name := "roam"
	if round > 0 {
		name = fmt.Sprintf("roam%d", round)
	}
	key, err := g.clientHomed(name, d.home)
	if err != nil {
		return nil, nil, err
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
		return nil, nil, err
	}
	if round == 0 {
		res.Counts["roaming_admitted_"+d.home] = roam.admitted()
		res.Counts["roaming_bound"] = bound
	}
	fmt.Fprintf(e.Log, "drill 6: roaming, homed in %s (round %d): %s (limit %d, bound %d)\n", d.home, round+1, roam, L, bound)
	if roam.admitted() > bound {
		return nil, nil, fmt.Errorf("roaming clients: %d admitted over both regions, above L·(1+t) = %d (%s)", roam.admitted(), bound, roam)
	}
	if float64(roam.admitted()) < float64(L)*(1-t) {
		return nil, nil, fmt.Errorf("roaming clients: %d admitted, quota stranded (limit %d)", roam.admitted(), L)
	}
	for reg, n := range roam.byRegion() {
		if n == 0 {
			return nil, nil, fmt.Errorf("roaming clients: nothing admitted in %s: not spread over both regions (%s)", reg, roam)
		}
	}
	if err := g.homeCounted(ctx, key, roam.admitted(), int(math.Floor(float64(L)*t/2))); err != nil {
		return nil, nil, err
	}
	return roam, regional, nil
}

// steady: one client under its limit, homed in d.home (see drill6).
func (g *globalDrill) steady(ctx context.Context, d *direction) (int, error) {
	key, err := g.clientHomed("steady", d.home)
	if err != nil {
		return 0, err
	}
	n := int(float64(g.rule.Limit) * 0.9)
	pace := 15 * time.Second / time.Duration(n)
	steady, err := g.drive(ctx, key, g.edges, 1, n, time.NewTicker(pace))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", d, err)
	}
	late, lateDenied := steady.after(time.Second)
	fmt.Fprintf(g.e.Log, "drill 6: under-limit client homed in %s: %s; %d of the %d sent after the first second denied\n", d.home, steady, lateDenied, late)
	if float64(lateDenied) > 0.01*float64(late) {
		return lateDenied, fmt.Errorf("%s: under-limit client: %d of %d requests after the first second denied (more than 1 %%)", d, lateDenied, late)
	}
	return lateDenied, nil
}

// minLatencySamples is the fewest admitted requests a p90 is compared on:
// with 10, the p90 is the second slowest, and were most of them waiting on
// the link (80 ms at least) it would show.
const minLatencySamples = 10

// latencyNeighbours is how many of the region rule's requests each global
// rule's request is set beside.
const latencyNeighbours = 5

// compareLatency checks that a global rule's admitted requests are about
// as fast as a region rule's on the edges of the region leasing across
// the link: what an edge decides from its allowance or overdraft never
// waits on the link. A request that did wait would take a round trip of
// the link, 80 ms at least.
//
// The leasing region admits only 15–100 of the flooded key's requests, in
// bursts (overdraft at the start, then each carve's batch), and the first
// burst comes as the flood's connections are being opened, when the
// machine is busiest. So each is set beside the region rule's admitted
// requests sent nearest in time to it on the same region's edges
// (latencyNeighbours of them): both sets then meet the same moments of
// the machine's noise. Their p90s may differ by the larger of 40 ms and
// half the region rule's p90 (the noise), not more. Were the global
// rule's requests waiting on the link, most of them would be slower by a
// round trip, which the p90 shows; the p99 of so few requests is their
// slowest one, so the p99s are reported, not asserted. The home region's
// and both regions' figures are reported only: there the global rule is
// a leased check on the region's own Redis, whose carves for the one
// flooded key queue behind each other, link or not.
func (g *globalDrill) compareLatency(res *Result, d *direction, global, regional *tally) error {
	for _, reg := range []string{d.away, d.home, ""} {
		lo, hi := global.span(reg)
		same := regional.nearest(global, reg, latencyNeighbours)
		gp, gn := global.quantile(reg, 0.99)
		rp, rn := same.quantile(reg, 0.99)
		g90, _ := global.quantile(reg, 0.9)
		r90, _ := same.quantile(reg, 0.9)
		where := reg
		if where == "" {
			where = "both regions"
		}
		fmt.Fprintf(g.e.Log, "drill 6: keys homed in %s: admitted requests on %s sent %s–%s into the flood: global rule p99 %s, p90 %s (%d); region rule's nearest in time p99 %s, p90 %s (%d)\n",
			d.home, where, lo.Round(time.Millisecond), hi.Round(time.Millisecond),
			gp.Round(100*time.Microsecond), g90.Round(100*time.Microsecond), gn, rp.Round(100*time.Microsecond), r90.Round(100*time.Microsecond), rn)
		if reg != d.away {
			continue
		}
		res.Times["p99_global_"+reg], res.Times["p99_region_"+reg] = gp, rp
		res.Times["p90_global_"+reg], res.Times["p90_region_"+reg] = g90, r90
		if gn < minLatencySamples || rn < minLatencySamples {
			return fmt.Errorf("latency on %s: %d and %d admitted requests: %w", where, gn, rn, errFewSamples)
		}
		if margin := max(40*time.Millisecond, r90/2); g90 > r90+margin {
			return fmt.Errorf("latency on %s: global rule p90 %s above the region rule's %s + %s (p99s %s and %s)", where, g90, r90, margin, gp, rp)
		}
	}
	return nil
}

// joinWAN starts both links and points each region's catalog at the
// other region's Redis through its link, then waits for every edge of
// both regions to reach the other region through it: the links start
// cut, so that an edge still on the direct address cannot pass for one on
// the link; each edge, asked for a key of the other region, marks that
// home unreachable (which only the link can make it do), then the links
// carry, with the WAN's latency, and every edge is back on the other
// region's Redis with no debt to pay.
//
// Towards the Sentinel region (dirs[0]) the link is one proxy in front of
// its master, named as a standalone Redis. Towards the Cluster region
// (dirs[1]) it is a proxy per node, and the catalog keeps the Cluster's
// own URL and maps every address the Cluster announces to its proxy: the
// edges' Cluster client reads the slot map and follows MOVED across the
// link as it would across a real WAN behind NAT.
func (g *globalDrill) joinWAN(ctx context.Context, res *Result) error {
	e := g.e
	sentinel, sentinelRegion, err := e.regionOfMode("sentinel")
	if err != nil {
		return err
	}
	cluster, clusterRegion, err := e.regionOfMode("cluster")
	if err != nil {
		return err
	}
	g.dirs = []*direction{{home: sentinel, away: cluster, link: faults.NewNet()}, {home: cluster, away: sentinel, link: faults.NewNet()}}
	if err := g.startLinks(ctx, sentinelRegion, clusterRegion); err != nil {
		g.close()
		return err
	}
	// Both directions at once: each has its own link and its own away
	// region's edges.
	start := time.Now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs = make([]error, len(g.dirs))
	)
	for i, d := range g.dirs {
		probe, err := g.clientHomed("probe", d.home)
		if err != nil {
			g.close()
			return fmt.Errorf("%s: %w", d, err)
		}
		wg.Go(func() {
			err := g.cutOff(ctx, d, probe, nil)
			if err == nil {
				err = g.heal(ctx, d)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", d, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.Times["wan_joined_"+d.away] = time.Since(start)
			fmt.Fprintf(e.Log, "drill 6: %s reaches %s's Redis over the link (%s)\n", d.away, d.home, time.Since(start).Round(time.Millisecond))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		g.close()
		return err
	}
	return nil
}

// startLinks starts both links, cut (the WAN's latency and a black hole),
// and pushes each away region's catalog with the home behind its link.
func (g *globalDrill) startLinks(ctx context.Context, sentinelRegion, clusterRegion stack.Region) error {
	e := g.e
	for _, d := range g.dirs {
		for _, tx := range append(wanToxics, blackHole) {
			if err := d.link.Add(tx); err != nil {
				return err
			}
		}
	}
	master, err := sentinelMaster(ctx, sentinelRegion)
	if err != nil {
		return err
	}
	proxied, err := g.dirs[0].link.Listen(master)
	if err != nil {
		return err
	}
	nodes, err := clusterAddrs(ctx, clusterRegion)
	if err != nil {
		return err
	}
	dial := map[string]string{}
	for _, n := range nodes {
		if dial[n], err = g.dirs[1].link.Listen(n); err != nil {
			return err
		}
	}
	cat, err := e.stackCatalog()
	if err != nil {
		return err
	}
	for _, d := range g.dirs {
		c := region.Catalog{Regions: slices.Clone(cat.Regions)}
		for i, r := range c.Regions {
			switch {
			case r.Name == d.home && d == g.dirs[0]:
				c.Regions[i] = region.CatalogRegion{Name: d.home, Redis: "redis://" + proxied, RedisMode: "standalone"}
			case r.Name == d.home:
				c.Regions[i].Dial = dial
			}
		}
		rc, err := region.NewClient(&api.Config{Address: strings.TrimPrefix(e.Out.Regions[d.away].Consul.HTTP, "http://")}, "")
		if err != nil {
			return err
		}
		if err := rc.PutCatalog(ctx, d.away, c); err != nil {
			return err
		}
	}
	return nil
}

// clusterAddrs lists every address the Cluster's clients may dial: the
// outputs' nodes and seeds and every node its shards announce.
func clusterAddrs(ctx context.Context, r stack.Region) ([]string, error) {
	seen := map[string]bool{}
	for _, a := range append(slices.Clone(r.Redis.Nodes), r.Redis.Seeds...) {
		seen[a] = true
	}
	o, err := redis.ParseClusterURL(r.Redis.URL)
	if err != nil {
		return nil, err
	}
	for _, a := range o.Addrs {
		seen[a] = true
	}
	c := redis.NewClusterClient(o)
	defer c.Close()
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the Cluster's shards: %w", err)
	}
	for _, s := range shards {
		for _, n := range s.Nodes {
			host := n.Endpoint
			if host == "" || host == "?" {
				host = n.IP
			}
			seen[net.JoinHostPort(host, strconv.FormatInt(n.Port, 10))] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// cutOff waits until every edge of d.away, asked for client (a key of
// d.home), decides d.home's keys from the static share; the replies go to
// all when it is set.
func (g *globalDrill) cutOff(ctx context.Context, d *direction, client string, all *tally) error {
	return eachEdge(ctx, g.e.Out.Regions[d.away].Edges(), 20*time.Second, "deciding "+d.home+"'s keys from the static share", func(ctx context.Context, ed stack.Edge) error {
		code, _, err := get(ctx, ed.URL, globalTarget(client, "198.51.100.200"))
		if err != nil {
			return err
		}
		if all != nil {
			all.replies = append(all.replies, reply{region: d.away, status: code})
		}
		v, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_fallback_share", d.home)
		if err == nil && v != 1 {
			err = fmt.Errorf("fallback_share %v", v)
		}
		return err
	})
}

// heal lifts d's black hole (the WAN's latency stays) and waits until
// every edge of d.away is back on d.home with no debt to pay: what it
// still shows is on keys whose home had nothing left
// (edgeguard_limiter_global_debt_exhausted_units), which no lease is
// asked for before that window ends there (an hour for drill-global; an
// earlier run's flood on the same stack leaves some).
func (g *globalDrill) heal(ctx context.Context, d *direction) error {
	d.link.Clear()
	for _, tx := range wanToxics {
		if err := d.link.Add(tx); err != nil {
			return err
		}
	}
	return eachEdge(ctx, g.e.Out.Regions[d.away].Edges(), 20*time.Second, "back on "+d.home+" with no debt", func(ctx context.Context, ed stack.Edge) error {
		fs, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_fallback_share", d.home)
		if err != nil {
			return err
		}
		debt, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_debt_units", d.home)
		if err != nil {
			return err
		}
		exhausted, err := sumGlobal(ctx, []stack.Edge{ed}, "edgeguard_limiter_global_debt_exhausted_units", d.home)
		if err != nil {
			return err
		}
		if fs != 0 || debt > exhausted {
			return fmt.Errorf("fallback_share %v, debt %v (%v of it on exhausted keys)", fs, debt, exhausted)
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

// span is when the first and the last admitted request on region's edges
// (every edge when region is "") were sent.
func (t *tally) span(region string) (lo, hi time.Duration) {
	first := true
	for _, r := range t.replies {
		if r.status == http.StatusOK && (region == "" || r.region == region) {
			if first || r.at < lo {
				lo = r.at
			}
			hi = max(hi, r.at)
			first = false
		}
	}
	return lo, hi
}

// nearest is, for each admitted reply of of on region's edges (every edge
// when region is ""), the k admitted replies of t on the same region as it
// sent nearest in time to it: a reply near several is there as many times.
func (t *tally) nearest(of *tally, region string, k int) *tally {
	admitted := map[string][]reply{}
	for _, r := range t.replies {
		if r.status == http.StatusOK {
			admitted[r.region] = append(admitted[r.region], r)
		}
	}
	out := &tally{}
	for _, o := range of.replies {
		if o.status == http.StatusOK && (region == "" || o.region == region) {
			out.replies = append(out.replies, closest(admitted[o.region], o.at, k)...)
		}
	}
	return out
}

// closest is the k replies of rs sent nearest to at: rs is reordered, and
// the result shares its array (callers copy it before the next call).
func closest(rs []reply, at time.Duration, k int) []reply {
	dist := func(r reply) time.Duration {
		if r.at > at {
			return r.at - at
		}
		return at - r.at
	}
	slices.SortStableFunc(rs, func(a, b reply) int { return cmp.Compare(dist(a), dist(b)) })
	return rs[:min(k, len(rs))]
}

// quantile is the q-quantile of the admitted replies' latencies on
// region's edges (every edge when region is ""), and how many there were.
func (t *tally) quantile(region string, q float64) (time.Duration, int) {
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
	return took[max(int(math.Ceil(float64(len(took))*q))-1, 0)], len(took)
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
	return sumOverEdges(ctx, edges, name, append([]string{"home", home}, extra...)...)
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

func (g *globalDrill) partition(ctx context.Context, res *Result, d *direction, bound int) error {
	e := g.e
	L := g.rule.Limit
	share := int(L) / len(g.names)
	home, away := d.home, d.away
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
	if err := d.link.Add(blackHole); err != nil {
		return err
	}
	cutAt := time.Now()
	var all tally
	// Witness: each cut-off edge, asked for the key (its carve hangs
	// until the deadline), marks the home unreachable.
	if err := g.cutOff(ctx, d, client, &all); err != nil {
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
	if err := g.heal(ctx, d); err != nil {
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
