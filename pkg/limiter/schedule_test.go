package limiter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// Schedule tests: the limiter's time-dependent paths (the store deadline,
// late answers and their settlement, the fallback's share, the breaker)
// walked on seeded, replayable schedules instead of wall-clock waits.
//
// N edges (Limiters) share one MemoryStore, each through a schedStore that
// hands every call to the harness. The harness owns a virtual clock (the
// limiter's, its fallback's and the store's) and decides, from a PCG stream
// seeded per run, when each client request arrives on which edge and what
// becomes of each store call: answered within the deadline, answered after
// the caller's deadline, refused, run with its reply lost, or held until
// the end of the run. It processes one event at a time in virtual-time
// order and waits on signals only (a decision returned, a call or a refund
// reached the store, and before the clock moves, the edges' work off its
// paths: quiet), so a seed replays the same run on any machine.
//
// The deadline seam needs nothing from the product: the limiter waits for
// a store call until its shared deadline timer fires or the caller's own
// context ends, whichever comes first (Limiter.take). The edges get a
// deadline (Config.Timeout) of a minute, which no run comes near, and the
// harness cancels the caller's context when virtual time passes the
// virtual deadline (schedDeadline): the caller gives up at exactly that
// point of the schedule, and the call is settled late when its answer is
// released. The caller's wait past the deadline while the store shows
// life (keepWaiting) is not walked here: it is reached only through the
// real timer (life_test.go walks its rule on values).
//
// Lanes are not under the harness: they live inside RedisStore, below the
// Store interface, and speak to a go-redis client. What they rely on from
// the limiter — the caller's wait (waitOf) ends when the caller gives up,
// so a queued call leaves its lane unsent — is asserted on every call the
// harness abandons.

var (
	schedSeed  = flag.Uint64("sched.seed", 0, "schedule tests: replay this one seed (0: run -sched.seeds seeds)")
	schedSeeds = flag.Int("sched.seeds", 200, "schedule tests: seeds per algorithm")
)

const (
	schedEdges    = 3
	schedDeadline = 250 * time.Millisecond // the virtual store deadline
	schedWait     = 10 * time.Second       // the longest a signal is waited for before the run fails
)

// fate is what becomes of one store call.
type fate uint8

const (
	fateInTime fate = iota // run and answered before the caller's deadline
	fateLate               // run and answered after the caller gave up
	fateError              // refused before the deadline, running nothing
	fateLost               // run, its reply lost (a reset): the units stay counted, but a member-keeping take's, removed by id (Decision.Unsure)
	fateHeld               // never answered until the run's end releases it (run then)
)

var fateNames = [...]string{"in time", "late", "error", "lost", "held"}

func (f fate) String() string { return fateNames[f] }

var errSchedRefused = errors.New("schedule: connection refused")
var errSchedReset = errors.New("schedule: connection reset")

// weather is a phase of the run: the odds of each fate, and whether probes
// succeed.
type weather struct {
	name    string
	odds    [5]int // per fate, out of their sum
	probeOK bool
}

var weathers = []weather{
	{"healthy", [5]int{1, 0, 0, 0, 0}, true},
	{"slow", [5]int{3, 2, 0, 0, 0}, true},
	{"down", [5]int{0, 0, 1, 0, 0}, false},
	{"frozen", [5]int{0, 1, 0, 0, 2}, false},
	{"flaky", [5]int{4, 1, 1, 1, 1}, true},
}

// schedCall is one Take as the harness sees it.
type schedCall struct {
	seq      int
	edge     int
	reqs     []Request
	wait     <-chan struct{} // waitOf(ctx).Done(), asked on arrival as a lane asks: closed when the caller gives up
	reply    chan schedReply
	fate     fate
	refuse   bool // the store refuses it, running nothing
	sent     time.Time
	answerAt time.Time
	answered bool
	fl       *inflight // the decision waiting on it, nil once it returned
	// ran is the store's reply to a call it ran at ranAt, before
	// answerAt (a starved caller's, starveCall); nil: run when answered.
	ran   *schedReply
	ranAt time.Time
}

type schedReply struct {
	ds  []Decision
	err error
}

type probeCall struct {
	edge  int
	reply chan error
}

// schedStore is one edge's view of the shared store: every Take and Probe
// goes through the harness; refunds go straight to the store, noted.
type schedStore struct {
	edge int
	h    *schedHarness
}

var _ Store = (*schedStore)(nil)

func (s *schedStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	c := &schedCall{edge: s.edge, reqs: slices.Clone(reqs), wait: waitOf(ctx).Done(), reply: make(chan schedReply, 1)}
	s.h.calls <- c
	r := <-c.reply
	return r.ds, r.err
}

func (s *schedStore) Refund(ctx context.Context, leases []Lease) error {
	err := s.h.store.Refund(ctx, leases)
	s.h.noteRefund(s.edge, leases)
	return err
}

// identity reads the shared store's identity (a restart, applyRestarts,
// changes it) once the harness lets the read land: at the instant the edge
// asked, or later (schedHarness.quiet), as an INFO round trip may.
func (s *schedStore) identity(ctx context.Context, l Limit) (string, error) {
	if !s.h.identNow.Load() {
		a := &identAsk{edge: s.edge, land: make(chan struct{})}
		s.h.mu.Lock()
		s.h.asks = append(s.h.asks, a)
		s.h.mu.Unlock()
		select {
		case <-a.land:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if a.refused {
			return "", errSchedRefused
		}
	}
	return s.h.store.identity(ctx, l)
}

// identAsk is an edge's identity read waiting for the harness to let it
// land.
type identAsk struct {
	edge    int
	land    chan struct{}
	seen    bool // the harness has chosen when it lands
	landed  bool
	refused bool // it landed while the store refused every call (h.land)
}

// land lets a land now. In a symmetric run, a read landing while the
// store refuses every call (down, or restarting: its identity is about to
// change) fails, as a call would.
func (h *schedHarness) land(a *identAsk) {
	if h.sym && !a.landed {
		k := h.phaseAt(h.now()).kind
		a.refused = k == phaseDown || k == phaseRestarting
	}
	a.letLand()
}

// letLand lets a land (once).
func (a *identAsk) letLand() {
	if !a.landed {
		a.landed = true
		close(a.land)
	}
}

func (s *schedStore) Shard(Limit) string { return "" }
func (s *schedStore) Remote() bool       { return true }
func (s *schedStore) Refresh()           {}

func (s *schedStore) Probe(context.Context, Limit) error {
	p := probeCall{edge: s.edge, reply: make(chan error, 1)}
	s.h.probes <- p
	return <-p.reply
}

// inflight is a decision under way on an edge.
type inflight struct {
	edge   int
	cancel context.CancelFunc
	res    chan decideResult
	call   *schedCall
}

type decideResult struct {
	v   Verdict
	err error
}

type evKind uint8

const (
	evDeadline evKind = iota // the caller's deadline passes
	evAnswer                 // the store answers (or refuses)
	evRelease                // a concurrency slot's response ends
	evRun                    // the store runs a call whose answer is read later (starveCall)
	evIdent                  // an identity read lands (quiet)
)

type event struct {
	at   time.Time
	seq  int
	kind evKind
	call *schedCall
	v    Verdict // evRelease
	edge int
	ask  *identAsk // evIdent
}

// edgeBreaker is the breaker model of one edge: what breaker.go promises.
type edgeBreaker struct {
	state    breakerState
	failures int
	openedAt time.Time
}

type schedHarness struct {
	t      *testing.T
	seed   uint64
	alg    Algorithm
	rng    *rand.Rand
	clock  *fakeClock
	store  *MemoryStore
	edges  []*Limiter
	lim    Limit
	calm   bool
	failN  int
	cool   time.Duration
	calls  chan *schedCall
	probes chan probeCall

	mu        sync.Mutex
	refunded  map[Lease]int // given back to the store, by value
	refundSig chan struct{}
	drops     []pendingDrop // give-backs whose cached denial may not be dropped yet
	// dropsAsked counts the give-backs noted per edge and cache shard.
	dropsAsked map[dropShard]uint64
	asks       []*identAsk   // identity reads not landed yet, in the order they came
	identNow   atomic.Bool   // identity reads land at once (the harness's own, knowIdentity)
	late       map[Lease]int // owed back by late answers, by value

	held   []*schedCall // frozen calls, released once the requests are done
	demand int          // requests made

	// Per edge: the remaining quota of its last store answer (-1: none
	// yet), and what its fallback admitted since.
	lastLeft [schedEdges]int64
	fbSince  [schedEdges]int64

	seq     int
	events  []*event
	busy    [schedEdges]*inflight
	models  [schedEdges]edgeBreaker
	weather weather
	left    int // calls before the weather changes
	trace   []string

	// Tallies, in units (every request costs 1).
	byStore, byFallback int64 // admitted, by where they were decided
	holding             int64 // units admitted by the store and not released
	replayed, restored  int64 // taken by the store for what it was owed
	lost                int64 // taken by calls whose reply was lost
	lateCalls, gaveUp   int
	fates               [5]int
	opens, probesOK     int
	over                int // 1 when the run admitted more than the limit

	// Symmetric runs (sym): the store's own state over virtual time,
	// met alike by every edge's calls (storePhase), and what was
	// admitted when, for the per-window count.
	sym      bool
	phases   []storePhase
	wiped    int         // restarts applied to the store
	admits   []time.Time // every admission (unit), when it was decided
	perPhase [4]int      // calls by the store's phase they met
	fbHeld   int64       // concurrency slots the fallbacks hold
	maxHeld  int64       // the most slots held at once, store and fallbacks
	final    bool        // the run's last rounds: the store answers at once
	kept     []event     // slots taken in the last rounds, released after them
	forgot   int64       // units the store's empty restarts forgot
	maxStore int64       // the most slots the store held at once
	last     Source      // the source of the last decision
	// finalFrom is when the last rounds began.
	finalFrom time.Time

	// Starved runs (starved): callers short of CPU, whose calls the
	// store runs within the deadline but whose answers sit unread past
	// it (starveCall), drawn from a stream of their own (srng) so the
	// other runs' schedules stay as they are.
	starved           bool
	srng              *rand.Rand
	irng              *rand.Rand // when each identity read lands (quiet)
	starvedGaveUp     int        // callers that gave up at the deadline, the answer unread
	starvedRead       int        // callers that read the answer after their deadline
	starvedAtDeadline int        // of both, answers read at the deadline's very instant
	lostWhy           string     // a starved run's quota lost once the store answered (quotaLost)
}

// newSchedHarness builds a run of seed for alg; calm runs have every call
// answered within the deadline.
func newSchedHarness(t *testing.T, alg Algorithm, seed uint64, sym bool) *schedHarness {
	stream := uint64(alg) + 1
	if sym {
		stream += 100
	}
	rng := rand.New(rand.NewPCG(seed, stream))
	srng := rand.New(rand.NewPCG(seed, stream+1000))
	irng := rand.New(rand.NewPCG(seed, stream+2000))
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)} // an hour's start
	h := &schedHarness{
		t: t, seed: seed, alg: alg, rng: rng, srng: srng, irng: irng, clock: clock,
		store:      NewMemoryStore(WithClock(clock.now)),
		calm:       seed%4 == 0,
		failN:      1 + rng.IntN(4),
		cool:       time.Duration(100+rng.IntN(900)) * time.Millisecond,
		calls:      make(chan *schedCall),
		probes:     make(chan probeCall),
		refunded:   map[Lease]int{},
		dropsAsked: map[dropShard]uint64{},
		late:       map[Lease]int{},
		refundSig:  make(chan struct{}, 1),
	}
	h.lim = Limit{Key: "sched", Algorithm: alg, Limit: int64(4 + rng.IntN(13)), Window: time.Hour}
	if h.sym = sym; sym {
		h.symSetup()
	}
	for i := range schedEdges {
		l, err := New(&schedStore{edge: i, h: h}, Config{
			Timeout:         time.Minute, // never reached: the harness's virtual deadline ends each wait
			BreakerFailures: h.failN,
			BreakerCooldown: h.cool,
			CacheSize:       64,
			FallbackKeys:    64,
			Now:             clock.now,
		}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.fallback = NewMemoryStore(WithClock(clock.now))
		if !sym {
			// Asymmetric runs model an edge cut off alone: one that has
			// not heard from the store for a window before the run (as
			// if started then), its calls failing since, decides
			// ⌊limit/N⌋ while they keep failing, until it hears from the
			// store, while the others keep counting at the store.
			l.started = clock.now().Add(-silentFor(h.lim))
			b := l.breakers.get(l.store.Shard(h.lim))
			b.downSince.Store(l.started.UnixNano())
			b.failedAt.Store(l.started.UnixNano())
		}
		h.edges = append(h.edges, l)
	}
	for i := range h.lastLeft {
		h.lastLeft[i] = -1
	}
	if !sym {
		h.newWeather()
	}
	h.logf("seed %d: %s limit %d per %v, %d edges, breaker after %d failures, cooldown %v, calm %v, symmetric %v",
		seed, alg, h.lim.Limit, h.lim.Window, schedEdges, h.failN, h.cool, h.calm, sym)
	return h
}

func (h *schedHarness) newWeather() {
	switch {
	case h.calm:
		h.weather = weathers[0]
	default:
		h.weather = weathers[h.rng.IntN(len(weathers))]
	}
	h.left = 2 + h.rng.IntN(10)
	h.logf("weather %s for %d calls", h.weather.name, h.left)
}

func (h *schedHarness) now() time.Time { return h.clock.now() }

func (h *schedHarness) logf(format string, args ...any) {
	h.trace = append(h.trace, fmt.Sprintf("%8v ", h.now().Sub(time.UnixMilli(1_800_000_000_000)))+fmt.Sprintf(format, args...))
}

// fail ends the run with the seed, how to replay it, and the schedule's
// last steps.
func (h *schedHarness) fail(format string, args ...any) {
	h.t.Helper()
	tail := h.trace[max(0, len(h.trace)-40):]
	test := "TestSchedule"
	if h.sym {
		test = "TestScheduleSymmetric"
	}
	if h.starved {
		test = strings.Replace(test, "Schedule", "ScheduleStarved", 1)
	}
	h.t.Fatalf("seed %d (%s): %s\nreplay: go test -race -count=1 -run '%s$/^%s$' ./pkg/limiter/ -sched.seed=%d\nlast steps:\n  %s",
		h.seed, h.alg, fmt.Sprintf(format, args...), test, h.alg, h.seed, strings.Join(tail, "\n  "))
}

func (h *schedHarness) noteRefund(edge int, leases []Lease) {
	h.mu.Lock()
	for _, ls := range leases {
		h.refunded[ls]++
		if !ls.Limit.Algorithm.Spec().Held {
			sh := h.edges[edge].cache.shard(cacheKeyOf(ls.Limit))
			h.dropsAsked[dropShard{edge, sh}]++
			h.drops = append(h.drops, pendingDrop{edge: edge, lim: ls.Limit, at: h.now(), nth: h.dropsAsked[dropShard{edge, sh}]})
		}
	}
	h.mu.Unlock()
	select {
	case h.refundSig <- struct{}{}:
	default:
	}
}

// schedule queues an event at at.
func (h *schedHarness) schedule(ev *event) {
	h.seq++
	ev.seq = h.seq
	h.events = append(h.events, ev)
}

// next takes the earliest event (by time, then by when it was queued).
func (h *schedHarness) next() *event {
	i := 0
	for j, ev := range h.events {
		if ev.at.Before(h.events[i].at) || ev.at.Equal(h.events[i].at) && ev.seq < h.events[i].seq {
			i = j
		}
	}
	ev := h.events[i]
	h.events = slices.Delete(h.events, i, i+1)
	return ev
}

// advance moves the clock to at, never back.
func (h *schedHarness) advance(at time.Time) {
	h.quiet()
	if d := at.Sub(h.now()); d > 0 {
		h.clock.add(d)
	}
}

// landAll lets every identity read asked for land at once (a probe's,
// which the probe's goroutine makes before it records the answer the
// harness waits for; the run's end).
func (h *schedHarness) landAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.asks {
		h.land(a)
	}
	h.asks = nil
}

// pendingDrop is a give-back to the store by edge, at (virtual time),
// whose edge drops the key's cached denial once Refund returns
// (Limiter.dropGivenBack).
// dropShard is an edge's cache shard.
type dropShard struct {
	edge int
	sh   *cacheShard
}

type pendingDrop struct {
	edge int
	lim  Limit
	at   time.Time
	// nth is how many drops the key's cache shard on edge will have made
	// once this one is done: two give-backs at one instant leave the
	// same givenBack, and the second drop, if late, would delete a
	// denial cached after the clock moved on.
	nth uint64
}

// quiet waits until what the edges do off the harness's paths at the
// present instant is done, so that the next event meets the same state
// whatever the machine's scheduling: the identity reads the edges start on
// goroutines of their own (wantIdentity), each landing at once or 1-300 ms
// later (irng, an evIdent), and the cached denials give-backs drop after
// their refunds return.
func (h *schedHarness) quiet() {
	h.applyRestarts() // an identity read landing now names the store as it is now
	ctx, cancel := context.WithTimeout(context.Background(), schedWait)
	defer cancel()
	err := proc.PollEvery(ctx, 50*time.Microsecond, "the edges' background work at this instant", func(context.Context) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		// Every read under way has asked before its asks are placed,
		// in the edges' order: the draws do not follow the goroutines'.
		var asked [schedEdges][]*identAsk
		for _, a := range h.asks {
			asked[a.edge] = append(asked[a.edge], a)
		}
		identing := func(e int) bool {
			l := h.edges[e]
			return l.breakers.get(l.store.Shard(h.lim)).identing.Load()
		}
		for e := range h.edges {
			if identing(e) && len(asked[e]) == 0 {
				return fmt.Errorf("edge %d reads the store's identity", e)
			}
		}
		for _, as := range asked {
			for _, a := range as {
				if a.seen {
					continue
				}
				a.seen = true
				if h.irng.IntN(2) == 0 {
					h.land(a)
					continue
				}
				h.schedule(&event{at: h.now().Add(time.Duration(1+h.irng.IntN(300)) * time.Millisecond), kind: evIdent, ask: a})
			}
		}
		h.asks = slices.DeleteFunc(h.asks, func(a *identAsk) bool { return a.landed })
		for e := range h.edges {
			if identing(e) && !slices.ContainsFunc(asked[e], func(a *identAsk) bool { return !a.landed }) {
				return fmt.Errorf("edge %d records the store's identity", e)
			}
		}
		for len(h.drops) > 0 {
			d := h.drops[0]
			c := h.edges[d.edge].cache
			sh := c.shard(cacheKeyOf(d.lim))
			sh.mu.Lock()
			done := !sh.givenBack.Before(d.at) && sh.drops >= d.nth
			sh.mu.Unlock()
			if !done {
				return fmt.Errorf("edge %d has not dropped its cached denial after a give-back", d.edge)
			}
			h.drops = h.drops[1:]
		}
		return nil
	})
	if err != nil {
		h.fail("%v", err)
	}
}

// run has n client requests arrive, then settles everything.
func (h *schedHarness) run(n int) {
	for i := range n {
		at := h.now().Add(time.Duration(h.rng.IntN(60)) * time.Millisecond)
		e := h.rng.IntN(schedEdges)
		for len(h.events) > 0 && !h.earliest().After(at) {
			h.step()
		}
		for h.busy[e] != nil { // an edge decides one request at a time
			h.step()
		}
		h.advance(at)
		h.decide(e, i)
	}
	h.drain()
	if h.sym {
		h.symEnd()
	}
	// The frozen store thaws: the calls it held run and answer, in the
	// order they were sent.
	for _, c := range h.held {
		h.schedule(&event{at: h.now().Add(time.Millisecond), kind: evAnswer, call: c})
		h.drain()
	}
	// What is still to land lands now: Close waits for the reads.
	h.identNow.Store(true)
	h.landAll()
	for _, l := range h.edges {
		l.Close()
	}
	h.check()
	if h.sym {
		h.symCheck()
	}
}

func (h *schedHarness) drain() {
	for len(h.events) > 0 {
		h.step()
	}
}

func (h *schedHarness) earliest() time.Time {
	t := h.events[0].at
	for _, ev := range h.events[1:] {
		if ev.at.Before(t) {
			t = ev.at
		}
	}
	return t
}

// decide has edge e decide request i, and waits until it is decided or its
// store call reached the store.
func (h *schedHarness) decide(e, i int) {
	ctx, cancel := context.WithCancel(context.Background())
	fl := &inflight{edge: e, cancel: cancel, res: make(chan decideResult, 1)}
	checks := []Check{{Limit: h.lim, Cost: 1, Nodes: schedEdges}}
	go func() {
		v, err := h.edges[e].Decide(ctx, checks)
		fl.res <- decideResult{v, err}
	}()
	select {
	case c := <-h.calls:
		if c.edge != e {
			h.fail("request %d on edge %d: a call came from edge %d", i, e, c.edge)
		}
		h.demand++
		h.expectCall(e, true)
		h.dispatch(c, fl)
	case r := <-fl.res:
		cancel()
		h.demand++
		if r.err == nil && r.v.Checks[0].Source != SourcePrefilter { // the cache answers before the breaker is asked
			h.expectCall(e, false)
		}
		h.settled(e, r, nil)
	case <-time.After(schedWait):
		h.fail("request %d on edge %d: neither decided nor sent in %v", i, e, schedWait)
	}
}

// dispatch gives call c its fate from the weather.
func (h *schedHarness) dispatch(c *schedCall, fl *inflight) {
	h.seq++
	c.seq, c.sent, c.fl = h.seq, h.now(), fl
	fl.call = c
	h.busy[fl.edge] = fl
	if h.sym {
		h.symDispatch(c)
		return
	}
	odds, sum := h.weather.odds, 0
	for _, o := range odds {
		sum += o
	}
	r := h.rng.IntN(sum)
	for f, o := range odds {
		if r < o {
			c.fate = fate(f)
			break
		}
		r -= o
	}
	switch c.fate {
	case fateInTime, fateError, fateLost:
		c.answerAt = c.sent.Add(time.Duration(h.rng.Int64N(int64(schedDeadline))))
	case fateLate:
		c.answerAt = c.sent.Add(schedDeadline + time.Millisecond + time.Duration(h.rng.Int64N(int64(2*time.Second))))
	}
	c.refuse = c.fate == fateError
	if !h.starveCall(c) {
		h.fates[c.fate]++
		if c.fate != fateHeld {
			h.schedule(&event{at: c.answerAt, kind: evAnswer, call: c})
		}
		h.schedule(&event{at: c.sent.Add(schedDeadline), kind: evDeadline, call: c})
	}
	h.logf("edge %d call %d (%d requests): %s", c.edge, c.seq, len(c.reqs), c.fate)
	if h.left--; h.left <= 0 {
		h.newWeather()
	}
}

// step processes the earliest event.
func (h *schedHarness) step() {
	ev := h.next()
	h.advance(ev.at)
	switch ev.kind {
	case evDeadline:
		c := ev.call
		if c.answered || c.fl == nil {
			return
		}
		fl := c.fl
		h.logf("edge %d call %d: deadline, the caller gives up", c.edge, c.seq)
		fl.cancel()
		r := h.await(fl, "a caller whose deadline passed")
		select {
		case <-c.wait: // what a lane takes a queued call out on
		default:
			h.fail("edge %d call %d: the caller gave up but its wait (waitOf) has not ended: a lane would still send it", c.edge, c.seq)
		}
		h.gaveUp++
		h.settled(fl.edge, r, c)
		if c.fate == fateHeld {
			h.held = append(h.held, c)
		}
	case evAnswer:
		h.answer(ev.call)
	case evIdent:
		h.applyRestarts()
		h.logf("edge %d: its identity read lands", ev.ask.edge)
		h.mu.Lock()
		h.land(ev.ask)
		h.mu.Unlock()
	case evRun:
		h.logf("edge %d call %d: run by the store, its caller starved", ev.call.edge, ev.call.seq)
		ev.call.ran, ev.call.ranAt = h.runInStore(ev.call), h.now()
	case evRelease:
		h.logf("edge %d: a response ends, its slot is released", ev.edge)
		h.edges[ev.edge].Release(context.Background(), ev.v)
		switch ev.v.Checks[0].Source {
		case SourceStore:
			h.holding--
		case SourceFallback:
			h.fbHeld--
		}
	}
}

// starveCall makes call c, which the store answers within its deadline, a
// starved caller's (starved runs, half of such calls): the store runs it
// then, but its answer sits unread until the caller's deadline or up to
// 300 ms after it, as on a machine short of CPU. The caller either gives
// up at its deadline — its timer ran first (at the answer's own instant
// too, the deadline first) — and the answer is late, or it reads the
// answer: the select found it ready, and the call was answered. Reports
// whether c was made so (its events are then scheduled).
func (h *schedHarness) starveCall(c *schedCall) bool {
	if !h.starved || h.calm || h.final || c.fate != fateInTime || c.refuse || h.srng.IntN(2) == 0 {
		return false
	}
	deadline := c.sent.Add(schedDeadline)
	ran := c.answerAt
	c.answerAt = deadline
	if h.srng.IntN(3) > 0 {
		c.answerAt = deadline.Add(time.Duration(1+h.srng.IntN(300)) * time.Millisecond)
	} else {
		h.starvedAtDeadline++
	}
	h.schedule(&event{at: ran, kind: evRun, call: c})
	if h.srng.IntN(2) == 0 {
		c.fate = fateLate
		h.starvedGaveUp++
		h.schedule(&event{at: deadline, kind: evDeadline, call: c}) // before the answer at one instant
	} else {
		h.starvedRead++
	}
	h.fates[c.fate]++
	h.schedule(&event{at: c.answerAt, kind: evAnswer, call: c})
	return true
}

// answer runs call c in the store (unless refused, or run already) and
// replies.
func (h *schedHarness) answer(c *schedCall) {
	c.answered = true
	r := c.ran
	if r == nil {
		r = h.runInStore(c)
	}
	h.logf("edge %d call %d: answered (%s)", c.edge, c.seq, c.fate)
	c.reply <- *r
	fl := c.fl
	if fl != nil { // its caller still waits
		h.settled(fl.edge, h.await(fl, "a caller whose call was answered"), c)
	}
	// The members a lost reply's takes may have added are removed,
	// whether or not they ran.
	for _, d := range r.ds {
		if d.Unsure && d.Lease.Units > 0 {
			h.late[d.Lease]++
			h.awaitRefund(c, d.Lease, "its reply lost")
		}
	}
	if fl != nil {
		return
	}
	// Answered after its caller gave up: what the call took for the
	// caller goes back to the store.
	h.lateCalls++
	perReq := takeErrs(r.err)
	if r.err != nil && perReq == nil {
		return
	}
	for j, q := range c.reqs {
		if q.Restore || q.Need > 0 || r.ds[j].Lease.Units <= 0 || perReq != nil && perReq[j] != nil {
			continue
		}
		h.late[r.ds[j].Lease]++
		h.awaitRefund(c, r.ds[j].Lease, fmt.Sprintf("answered %v after its caller gave up", h.now().Sub(c.sent)-schedDeadline))
	}
}

// runInStore runs call c in the store (unless refused): its reply.
func (h *schedHarness) runInStore(c *schedCall) *schedReply {
	h.applyRestarts()
	var r schedReply
	if c.refuse {
		r = schedReply{ds: make([]Decision, len(c.reqs)), err: errSchedRefused}
	} else {
		ds, err := h.store.Take(context.Background(), c.reqs)
		perReq := takeErrs(err)
		if err != nil && perReq == nil {
			h.fail("edge %d call %d: the store refused %v: %v", c.edge, c.seq, c.reqs, err)
		}
		for j, q := range c.reqs {
			if perReq != nil && perReq[j] != nil {
				// A replay landing past the window it was admitted in
				// is refused: the next window owes nothing for it.
				if !errors.Is(perReq[j], errWindowEnded) || q.Need == 0 {
					h.fail("edge %d call %d: the store refused %v: %v", c.edge, c.seq, q, perReq[j])
				}
				h.logf("edge %d call %d: its replay of %d refused, the window it was admitted in ended", c.edge, c.seq, q.Cost)
				continue
			}
			switch {
			case q.Restore:
				h.restored += ds[j].Admitted
			case c.fate == fateLost && q.Limit.Algorithm.Spec().Members:
				// Removed again: the limiter gives back the members
				// of a take whose reply was lost (Decision.Unsure).
			case q.Need > 0:
				h.replayed += ds[j].Admitted
			case c.fate == fateLost:
				h.lost += ds[j].Admitted
			}
		}
		r = schedReply{ds: ds, err: err}
		if c.fate == fateLost {
			// As RedisStore answers a take whose reply was lost: a
			// member-keeping take names the members it may have added
			// (Decision.Unsure), the others say nothing.
			lost := make([]Decision, len(c.reqs))
			for j, q := range c.reqs {
				if q.Limit.Algorithm.Spec().Members && !q.Restore && (perReq == nil || perReq[j] == nil) {
					lost[j] = Decision{Unsure: true, Lease: Lease{Limit: q.Limit, id: ds[j].Lease.id, first: 1, Units: q.Cost}}
				}
			}
			r = schedReply{ds: lost, err: errSchedReset}
		}
	}
	return &r
}

// awaitRefund waits until ls, owed back by call c (what: why), is given
// back to the store.
func (h *schedHarness) awaitRefund(c *schedCall, ls Lease, what string) {
	deadline := time.After(schedWait)
	for {
		h.mu.Lock()
		n := h.refunded[ls]
		h.mu.Unlock()
		if n >= h.late[ls] {
			h.logf("edge %d call %d: its %d units given back (%s)", c.edge, c.seq, ls.Units, what)
			return
		}
		select {
		case <-h.refundSig:
		case <-deadline:
			h.fail("edge %d call %d, %s: its %d units were never given back (waited %v)",
				c.edge, c.seq, what, ls.Units, schedWait)
		}
	}
}

// await is fl's decision.
func (h *schedHarness) await(fl *inflight, what string) decideResult {
	select {
	case r := <-fl.res:
		fl.cancel()
		if fl.call != nil {
			fl.call.fl = nil
		}
		h.busy[fl.edge] = nil
		return r
	case <-time.After(schedWait):
		h.fail("edge %d: %s was not decided in %v", fl.edge, what, schedWait)
		return decideResult{}
	}
}

// settled records a decision of edge e (c: its store call, nil if none)
// and walks the breaker model.
func (h *schedHarness) settled(e int, r decideResult, c *schedCall) {
	if r.err != nil {
		h.fail("edge %d: Decide: %v", e, r.err)
	}
	d := r.v.Checks[0]
	h.logf("edge %d: allowed %v from %s (remaining %d)", e, r.v.Allowed, d.Source, d.Remaining)
	h.last = d.Source
	if h.calm && h.lim.Window == time.Hour {
		// Every call answered within the deadline: the store decides
		// (or the over-limit cache, for what it denied), and the
		// clients get the whole limit, no more and no fewer.
		if d.Source != SourceStore && d.Source != SourcePrefilter {
			h.fail("edge %d: decided by %s though every call is answered within the deadline", e, d.Source)
		}
		if want := h.holding < h.lim.Limit; r.v.Allowed != want {
			h.fail("edge %d: allowed %v by %s with %d of %d units held: want %v", e, r.v.Allowed, d.Source, h.holding, h.lim.Limit, want)
		}
	}
	if d.Source == SourceStore {
		h.lastLeft[e], h.fbSince[e] = d.Remaining, 0
	}
	if r.v.Allowed {
		at := h.now()
		if c != nil && c.ran != nil && d.Source == SourceStore {
			// The store counted it when it ran the call: its window
			// is the store's, whenever the caller read the answer.
			at = c.ranAt
		}
		h.admits = append(h.admits, at)
		switch d.Source {
		case SourceStore:
			h.byStore++
			h.holding++
		case SourceFallback:
			h.byFallback++
			h.fbSince[e]++
			if h.lim.Window == time.Hour { // symCheck counts windows that end within a run
				h.checkShare(e)
			}
			if h.alg.Spec().Held {
				h.fbHeld++
			}
		default:
			h.fail("edge %d: allowed from %s", e, d.Source)
		}
		h.maxHeld = max(h.maxHeld, h.holding+h.fbHeld)
		h.maxStore = max(h.maxStore, h.holding)
		switch {
		case h.final && h.alg.Spec().Held:
			h.kept = append(h.kept, event{kind: evRelease, v: r.v, edge: e}) // held through the last rounds
		case h.alg.Spec().Held:
			h.schedule(&event{at: h.now().Add(time.Duration(10+h.rng.IntN(300)) * time.Millisecond), kind: evRelease, v: r.v, edge: e})
		}
	}
	if c != nil {
		m := &h.models[e]
		if c.fate == fateInTime {
			m.failures, m.state = 0, breakerClosed
		} else if m.failures++; m.state == breakerClosed && m.failures >= h.failN {
			m.state, m.openedAt = breakerOpen, h.now()
			h.opens++
		}
	}
	h.checkBreaker(e)
}

// checkShare asserts edge e's fallback has admitted, since its last store
// answer, no more than its share of what that answer left: ⌊remaining/N⌋,
// or ⌊limit/N⌋ before any answer. Held limits (concurrency) are not
// seeded from the store's answer: their fallback holds ⌊limit/N⌋ slots.
func (h *schedHarness) checkShare(e int) {
	share := h.lim.Limit / schedEdges
	if left := h.lastLeft[e]; left >= 0 && !h.alg.Spec().Held {
		share = left / schedEdges
	}
	if h.alg.Spec().Held {
		return // slots come back on release: what is held, not admitted, is bounded
	}
	if h.fbSince[e] > share {
		last := "no store answer yet"
		if h.lastLeft[e] >= 0 {
			last = fmt.Sprintf("the store's last answer left %d", h.lastLeft[e])
		}
		h.fail("edge %d: its fallback admitted %d since its last store answer (%s, limit %d, %d edges): its share is %d",
			e, h.fbSince[e], last, h.lim.Limit, schedEdges, share)
	}
}

// expectCall walks the breaker model for a decision of edge e that sent a
// call (sent) or did not, and answers the probe it started, if any.
func (h *schedHarness) expectCall(e int, sent bool) {
	m := &h.models[e]
	b := h.edges[e].breakers.get("")
	switch {
	case sent && m.state != breakerClosed:
		h.fail("edge %d: a call went to the store while its breaker is %v (opened at %v, cooldown %v)", e, m.state, m.openedAt, h.cool)
	case sent:
		return
	case m.state == breakerClosed:
		return // the over-limit cache, or a decision not needing the store
	case m.state == breakerOpen && h.now().Sub(m.openedAt) >= h.cool:
		if s := breakerState(b.state.Load()); s != breakerHalfOpen {
			h.fail("edge %d: the cooldown (%v) passed, yet the breaker is %v, not half-open", e, h.cool, s)
		}
		var p probeCall
		select {
		case p = <-h.probes:
		case <-time.After(schedWait):
			h.fail("edge %d: half-open, but no probe reached the store in %v", e, schedWait)
		}
		ok := h.weather.probeOK
		if h.sym {
			ok = h.phaseAt(h.now()).kind == phaseUp
			h.applyRestarts() // the probe reads who answers: the store as it is now
		}
		h.logf("edge %d: probe, ok %v", e, ok)
		want := breakerOpen
		if ok {
			p.reply <- nil
			m.state, m.failures = breakerClosed, 0
			want = breakerClosed
			h.probesOK++
		} else {
			p.reply <- errSchedRefused
			m.state, m.openedAt = breakerOpen, h.now()
			m.failures++
		}
		// The probe's goroutine records its answer once Probe returns.
		ctx, cancel := context.WithTimeout(context.Background(), schedWait)
		err := proc.PollEvery(ctx, time.Millisecond, "the probe's answer recorded", func(context.Context) error {
			h.landAll() // the probe reads who answers before it records
			if s := breakerState(b.state.Load()); s != want {
				return fmt.Errorf("breaker %v", s)
			}
			return nil
		})
		cancel()
		if err != nil {
			h.fail("edge %d: the probe answered (ok %v): %v", e, ok, err)
		}
	}
	h.checkBreaker(e)
}

func (s breakerState) String() string { return [...]string{"closed", "open", "half-open"}[s] }

// checkBreaker compares edge e's breaker with the model.
func (h *schedHarness) checkBreaker(e int) {
	b := h.edges[e].breakers.get("")
	if got, want := breakerState(b.state.Load()), h.models[e].state; got != want {
		h.fail("edge %d: breaker %v, want %v (%d consecutive failures, opens after %d)", e, got, want, h.models[e].failures, h.failN)
	}
}

// check asserts the run's properties once every call is settled.
func (h *schedHarness) check() {
	for i := range h.busy {
		if h.busy[i] != nil {
			h.fail("edge %d still deciding after the run", i)
		}
	}
	h.logf("admitted %d by the store, %d by the fallback; late calls %d, abandoned %d; replayed %d, restored %d, lost %d; fates %v; breaker opened %d times",
		h.byStore, h.byFallback, h.lateCalls, h.gaveUp, h.replayed, h.restored, h.lost, h.fates, h.opens)
	if *schedSeed != 0 {
		h.t.Log(strings.Join(h.trace, "\n"))
	}
	// What the store counts now.
	probe := Request{Limit: h.lim, Cost: h.lim.Limit, Need: 1}
	ds, err := h.store.Take(context.Background(), []Request{probe})
	if err != nil {
		h.fail("reading the store's count: %v", err)
	}
	used := h.lim.Limit - ds[0].Admitted
	if h.alg.Spec().Held {
		if used != h.holding+h.lost {
			h.fail("the store holds %d slots after every response ended; want %d (slots of lost replies): %d leaked",
				used, h.lost, used-h.lost)
		}
		return
	}
	if h.lim.Window < time.Hour || h.wiped > 0 {
		return // symCheck counts per window; a restart emptied the store's count
	}
	// The window's bound: above the limit only what the fallbacks
	// admitted and the store could not count when it answered again
	// (their replay found the window full). A fallback's share is
	// bounded by checkShare; the store's own admissions and the
	// replays it counted never pass the limit.
	if over, uncounted := h.byStore+h.byFallback-h.lim.Limit, h.byFallback-h.replayed; over > max(0, uncounted) {
		h.fail("admitted %d (%d by the store, %d by the fallback, %d of them replayed) in one window of limit %d: %d over, only %d admitted by fallbacks went uncounted",
			h.byStore+h.byFallback, h.byStore, h.byFallback, h.replayed, h.lim.Limit, over, uncounted)
	}
	if h.byStore+h.byFallback > h.lim.Limit {
		h.over++
	}
	if want := min(h.lim.Limit, h.holding+h.replayed+h.restored+h.lost); used != want {
		h.fail("the store counts %d; the admitted requests hold %d, replays %d, restores %d, lost replies %d: want %d",
			used, h.holding, h.replayed, h.restored, h.lost, want)
	}
	if h.calm && h.byStore != min(h.lim.Limit, int64(h.demand)) {
		h.fail("calm run: the store admitted %d of %d requests under a limit of %d", h.byStore, h.demand, h.lim.Limit)
	}
}

// schedSeedList is the seeds to run: the one replayed, or 1..-sched.seeds.
func schedSeedList() []uint64 {
	if *schedSeed != 0 {
		return []uint64{*schedSeed}
	}
	out := make([]uint64, *schedSeeds)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// TestSchedule walks seeded schedules of latency, late answers, refusals,
// lost replies and frozen calls over three edges sharing one store, per
// algorithm. After every step: each edge's breaker is where breaker.go's
// rules put it, each fallback admitted no more than its share of its last
// store answer, and a caller that gave up ended its wait. After every run:
// every late answer's units were given back, the store counts exactly what
// the admitted requests (and what it was owed) hold — no slot leaked —
// and the window went over its limit by no more than the fallback
// admissions the store did not count. In calm runs (every call answered
// within the deadline) the store decides every request: the clients get
// the limit, no fewer and no more.
//
// The window is not held to the limit itself: an edge whose store has
// not answered it yet takes ⌊limit/N⌋ though the store counted for the
// others (decideLocally's premise: down for every node), and an edge cut
// off alone takes ⌊remaining/N⌋ of a remainder the others keep taking at
// the store.
func TestSchedule(t *testing.T) {
	t.Parallel() // a virtual clock and a harness of its own: CPU only
	for _, alg := range []Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.SlidingLog, limit.Concurrency} {
		t.Run(alg.String(), func(t *testing.T) {
			var sum schedHarness
			seeds := schedSeedList()
			for _, seed := range seeds {
				h := runSchedule(t, alg, seed)
				sum.lateCalls += h.lateCalls
				sum.gaveUp += h.gaveUp
				sum.byFallback += h.byFallback
				sum.replayed += h.replayed
				sum.opens += h.opens
				sum.probesOK += h.probesOK
				sum.over += h.over
				for f, n := range h.fates {
					sum.fates[f] += n
				}
			}
			t.Logf("%d seeds: calls by fate (in time, late, error, lost, held) %v; %d callers gave up, %d calls answered after; breakers opened %d times, closed by a probe %d; fallbacks admitted %d units, %d replayed",
				len(seeds), sum.fates, sum.gaveUp, sum.lateCalls, sum.opens, sum.probesOK, sum.byFallback, sum.replayed)
			if !alg.Spec().Held {
				t.Logf("%d of %d runs admitted more than the limit in the window, each by no more than its fallback admissions the store did not count", sum.over, len(seeds))
			}
			if len(seeds) < 100 {
				return
			}
			// The schedules reach every path they are here for.
			for f, n := range sum.fates {
				require.Positive(t, n, "calls %s", fate(f))
			}
			require.Positive(t, sum.lateCalls, "calls answered after their caller gave up")
			require.Positive(t, sum.opens, "breakers opened")
			require.Positive(t, sum.probesOK, "breakers closed by a probe")
			require.Positive(t, sum.byFallback, "units admitted by a fallback")
			if !alg.Spec().Held {
				require.Positive(t, sum.replayed, "fallback admissions replayed")
			}
		})
	}
}

// runSchedule runs one seed of alg.
func runSchedule(t *testing.T, alg Algorithm, seed uint64) *schedHarness {
	h := newSchedHarness(t, alg, seed, false)
	h.run(int(3*h.lim.Limit) + h.rng.IntN(10))
	return h
}

// A seed replays: the same schedule, step for step, whatever the machine
// does meanwhile. The trace holds every fate, every decision with its
// source and remaining quota, every probe and give-back, on the virtual
// clock.
func TestScheduleReplays(t *testing.T) {
	for _, alg := range []Algorithm{limit.FixedWindow, limit.Concurrency} {
		for seed := uint64(1); seed <= 8; seed++ {
			a, b := runSchedule(t, alg, seed), runSchedule(t, alg, seed)
			require.Equal(t, a.trace, b.trace, "seed %d (%s) ran two ways", seed, alg)
			require.Greater(t, len(a.trace), 10)
		}
	}
}
