package behavior

import (
	"hash/maphash"
	"slices"
	"sync"
)

// Tracker is an edge's view of its clients: each client's State as this
// edge sees it, the region's reading from Redis (the last reply), and the
// updates waiting for the next flush (requests that reached Redis on no
// call of their own: denied by the over-limit cache, decided by the
// fallback, answered blocked, or a 429 given). Its memory is bounded: at
// most MaxClients clients, a client at level normal with nothing pending
// evicted first.
type Tracker struct {
	params Params
	shards [numShards]shard
	perCap int
	seed   maphash.Seed
	// evicted and lostPending count clients dropped to make room and
	// updates dropped because too many waited for one flush.
	evicted, lostPending func()
}

const numShards = 64

// DefaultMaxClients bounds a tracker: about 400 bytes a client, so some
// 26 MB at the cap.
const DefaultMaxClients = 1 << 16

type shard struct {
	mu      sync.Mutex
	m       map[string]*entry
	pending []*entry
}

type entry struct {
	id    string
	local State
	// localLv holds until localUntil (ms), as of the last update.
	localLv    Level
	localUntil int64
	// The region's reading, good until remoteUntil (ms): when the level
	// could have stepped down, or, for normal, one round trip's worth.
	remote      Verdict
	remoteUntil int64
	judged      Level // the level the edge last judged a request on
	pend        *Pending
}

// Pending is what an edge owes Redis for one client.
type Pending struct {
	ID  string
	Obs Obs
}

// NewTracker builds a tracker for params; maxClients <= 0 means
// DefaultMaxClients. evicted and lostPending (may be nil) are called when a
// client is dropped to make room, and when an update is dropped because
// MaxClients updates already wait for the next flush.
func NewTracker(p Params, maxClients int, evicted, lostPending func()) *Tracker {
	if maxClients <= 0 {
		maxClients = DefaultMaxClients
	}
	if evicted == nil {
		evicted = func() {}
	}
	if lostPending == nil {
		lostPending = func() {}
	}
	t := &Tracker{params: p, perCap: max(maxClients/numShards, 1), seed: maphash.MakeSeed(), evicted: evicted, lostPending: lostPending}
	for i := range t.shards {
		t.shards[i].m = map[string]*entry{}
	}
	return t
}

// Params are the tracker's.
func (t *Tracker) Params() *Params { return &t.params }

// SetParams changes the settings (the rules changed); clients keep their
// state.
func (t *Tracker) SetParams(p Params) {
	for i := range t.shards {
		t.shards[i].mu.Lock()
	}
	t.params = p
	for i := range t.shards {
		t.shards[i].mu.Unlock()
	}
}

func (t *Tracker) shard(id string) *shard {
	return &t.shards[maphash.String(t.seed, id)%numShards]
}

// get returns id's entry, making room for it; called locked.
func (t *Tracker) get(s *shard, id string, now int64) *entry {
	if e := s.m[id]; e != nil {
		return e
	}
	if len(s.m) >= t.perCap {
		t.evictOne(s, now)
	}
	e := &entry{id: id}
	s.m[id] = e
	return e
}

// evictOne drops a client: among a few (map order is random), the first
// at level normal with nothing pending, else the first.
func (t *Tracker) evictOne(s *shard, now int64) {
	var victim *entry
	n := 0
	for _, e := range s.m {
		if victim == nil {
			victim = e
		}
		if e.pend == nil && t.level(e, now) == Normal {
			victim = e
			break
		}
		if n++; n >= 8 {
			break
		}
	}
	if victim == nil {
		return
	}
	// An entry with an update pending stays in the shard's pending list:
	// the update goes out with the next flush all the same.
	delete(s.m, victim.id)
	t.evicted()
}

// level is e's level at now: the higher of this edge's view and the
// region's last reading, each while it holds.
func (t *Tracker) level(e *entry, now int64) Level {
	lv := Normal
	if e.localLv > Normal {
		if now < e.localUntil {
			lv = e.localLv
		} else {
			v := e.local.Peek(&t.params, now)
			e.localLv, e.localUntil = v.Level, now+v.HoldMs
			lv = v.Level
		}
	}
	if now < e.remoteUntil && e.remote.Level > lv {
		lv = e.remote.Level
	}
	return lv
}

// Judge is the level a request of id at now is treated by, and the level
// the previous request was (to count changes).
func (t *Tracker) Judge(id string, now int64) (lv, was Level) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[id]
	if e == nil {
		return Normal, Normal
	}
	lv, was = t.level(e, now), e.judged
	e.judged = lv
	return lv, was
}

// Observe applies o to this edge's view of id at now and returns whether
// the requests came before a Retry-After this edge gave.
func (t *Tracker) Observe(id string, o Obs, now int64) (early bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := t.get(s, id, now)
	early = e.local.Early(now)
	v := e.local.Observe(&t.params, o, now)
	e.localLv, e.localUntil = v.Level, now+v.HoldMs
	return early
}

// Pend adds o to what the next flush sends for id. o.Judge is ignored:
// the edge judged these requests (o.Early).
func (t *Tracker) Pend(id string, o Obs, now int64) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := t.get(s, id, now)
	if e.pend == nil {
		if len(s.pending) >= t.perCap {
			t.lostPending() // a flood between two flushes: bounded, counted
			return
		}
		e.pend = &Pending{ID: id}
		s.pending = append(s.pending, e)
	}
	p := &e.pend.Obs
	p.N += o.N
	p.Early += o.Early
	p.RetryMs = max(p.RetryMs, o.RetryMs)
	if o.Q > 0 {
		p.Q = o.Q
	}
	for _, r := range o.Routes {
		if len(p.Routes) < maxFlushRoutes && !slices.Contains(p.Routes, r) {
			p.Routes = append(p.Routes, r)
		}
	}
}

// Drain takes every pending update, for a flush.
func (t *Tracker) Drain() []Pending {
	var out []Pending
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.pending {
			out = append(out, *e.pend)
			e.pend = nil
		}
		clear(s.pending)
		s.pending = s.pending[:0]
		s.mu.Unlock()
	}
	return out
}

// Remote records the region's reading of id, taken at now (ms); rtt is a
// round trip's worth of ms, how long a normal reading is trusted.
func (t *Tracker) Remote(id string, v Verdict, now, rtt int64) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[id]
	if e == nil {
		return // evicted meanwhile: the next request asks again
	}
	e.remote = v
	e.remoteUntil = now + max(v.HoldMs, rtt)
}

// Client is one client's state as /debug/clients shows it.
type Client struct {
	ID     string  `json:"id"`
	Level  string  `json:"level"`
	Local  Reading `json:"local"`
	Region Reading `json:"region"`
	// RegionFresh is false when the region's reading is older than it
	// holds for (Redis unreachable, or no request since).
	RegionFresh bool `json:"region_fresh"`
	Pending     bool `json:"pending"`
}

// Reading is a Verdict for display.
type Reading struct {
	Level  string  `json:"level"`
	Score  float64 `json:"score"`
	HoldMs int64   `json:"hold_ms"`
	Burst  float64 `json:"burst"`
	Replay int64   `json:"replay"`
	Scan   int64   `json:"scan"`
	Denial int64   `json:"denial"`
}

func reading(v Verdict) Reading {
	return Reading{Level: v.Level.String(), Score: float64(v.Score) / 1000, HoldMs: v.HoldMs, Burst: v.Raw.Burst, Replay: v.Raw.Replay, Scan: v.Raw.Scan, Denial: v.Raw.Denial}
}

// Lookup returns id's state at now, if the tracker has it.
func (t *Tracker) Lookup(id string, now int64) (Client, bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[id]
	if e == nil {
		return Client{}, false
	}
	return Client{
		ID: id, Level: t.level(e, now).String(),
		Local: reading(e.local.Peek(&t.params, now)), Region: reading(e.remote),
		RegionFresh: now < e.remoteUntil, Pending: e.pend != nil,
	}, true
}

// Len is how many clients the tracker holds.
func (t *Tracker) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
