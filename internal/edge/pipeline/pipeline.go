package pipeline

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/edgeguard/edgeguard/internal/edge/bhlayer"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// stage is one concern of the request path. It either answers the request
// itself and returns the outcome (refused, shed, denied…), or passes it on
// with e.next(sc) and returns what the rest made of it; what it holds for
// the rest of the request (a worker slot, a concurrency slot) it gives back
// when next returns.
type stage func(e *Pipeline, sc *scratch) string

// pipeline is the request path, in order (doc.go has the steps; each
// stage lives in the file named after it). Record comes first because it
// wraps the others: it writes the metrics and the access log when they
// return.
var pipeline []stage

func init() {
	pipeline = []stage{
		(*Pipeline).recordStage,    // stage_record.go
		(*Pipeline).screenStage,    // stage_screen.go
		(*Pipeline).identifyStage,  // stage_identify.go
		(*Pipeline).shedStage,      // stage_shed.go
		(*Pipeline).matchStage,     // stage_match.go
		(*Pipeline).checksStage,    // stage_checks.go
		(*Pipeline).penaltyStage,   // stage_penalty.go
		(*Pipeline).behaviourStage, // stage_behaviour.go
		(*Pipeline).limitStage,     // stage_limit.go
		(*Pipeline).proxyStage,     // stage_proxy.go
	}
}

// Handle runs a request through the pipeline: fasthttp's handler for
// HTTP/1.x, and the HTTP/2 server's for each stream (listen/h2.go).
func (e *Pipeline) Handle(ctx *fasthttp.RequestCtx) {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		sc.reset()
		scratchPool.Put(sc)
	}()
	sc.ctx = ctx
	e.next(sc)
}

// next runs the request's next stage. A header or query parameter a stage
// decided on that was sent more than once (headerLookup) ends the request
// before the next stage: the one place that check is made.
func (e *Pipeline) next(sc *scratch) string {
	if r := sc.headers.Repeated(); r != "" {
		refuseRepeated(sc.ctx, r)
		sc.refusal = reasonRepeatedField
		return outcomeRefused
	}
	s := pipeline[sc.stage]
	sc.stage++
	return s(e, sc)
}

// scratch is a request's state and reusable buffers: what the stages
// found out, for the ones after them and for the record.
type scratch struct {
	ctx     *fasthttp.RequestCtx
	stage   int       // the next stage's index in pipeline
	start   time.Time // when the request reached the pipeline
	peer    netip.Addr
	trusted bool // the peer is a trusted proxy (internal/edge/trust)
	headers headerLookup
	header  func(string) (string, bool) // headers.Get, bound once per scratch
	query   func(string) (string, bool) // headers.Query, likewise
	// gone is clientGone, bound once per scratch: a closure made per
	// request would be allocated per request, as the shedder's queues
	// keep what they ask while a request waits.
	gone     func() bool
	connGone func(net.Conn) bool // Conns.Gone, set by shedStage
	host     string              // normalized (rules.NormalizeHost)
	tenant   string              // the host's share of the workers (Parts.Route)
	path     string              // as the host's origin reads it (pathsem.Normalize)
	pool     *origin.Proxy       // the host's origin pool
	paths    hosts.PathPolicy    // how the host's paths are read
	bh       bhlayer.Request     // the client's part in the behaviour layer
	req      rules.Request       // what the rules see
	// policy is the rule policy this scratch's last 429 used (deny):
	// kept across requests (reset leaves it), so a flood by one rule
	// finds it without the map.
	policy *policyEntry
	// decisionSeen is the decisions counter this scratch's last checked
	// rule added to (record), kept across requests as policy is.
	decisionSeen decisionMemo

	ruling
	recorded
}

// ruling is what the rules, the escapes and the limiter made of a request.
type ruling struct {
	matches  []rules.Match
	bypassed []*rules.CompiledRule // rules whose bypass named the request
	after    []rules.Match         // rules that count by the response (response.go)
	checks   []limiter.Check
	// decided is the limiter's buffer for the checks' decisions (its
	// verdict is done with when the limit stage returns).
	decided []limiter.Decision
	// afterChecks are after's checks, cost still the rule's.
	afterChecks []limiter.Check
	rider       *limiter.Rider // the behaviour layer's update, riding with checks
	// limitDenied: the limiter denied; denyRetry is the longest
	// Retry-After of its denials, before penalties lengthen it.
	limitDenied bool
	denyRetry   time.Duration
	applied     []applied
	all         []applied // every rule's outcome, shadow ones too (access log)
	// penalised: denied by a penalty (escapes.go), not counted.
	penalised bool
	// atEnd gives back a concurrency slot the limit stage holds (nil:
	// none); endHandedOn says the proxy handed it to a streamed body's
	// end (origin.Hop.AtEnd) instead of the limit stage's return.
	atEnd       func()
	endHandedOn bool
}

// recorded is the rest of what the record writes down of a request.
type recorded struct {
	tier     shedder.Tier  // TierNone until classified
	id       string        // the request id, once proxied
	upstream time.Duration // time at the origin
	client   netip.Addr
	trace    context.Context // the request span's context; nil without tracing
	span     trace.Span
	// refusal is why the edge refused the request (refusal.go); unread:
	// fasthttp could not read it.
	refusal string
	unread  bool
	// idBuf and peerBuf hold the request id the edge made and the peer's
	// address as text, for the request's length (id and the origin's hop
	// are views of them).
	idBuf   [32]byte
	peerBuf [64]byte
}

func newScratch() any {
	sc := &scratch{recorded: recorded{tier: shedder.TierNone}}
	sc.header, sc.query = sc.headers.Get, sc.headers.Query
	sc.gone = sc.clientGone
	return sc
}

// clientGone says whether the request's client has left (asked while the
// request waits in a shedder queue, from the queue's goroutine).
func (sc *scratch) clientGone() bool { return sc.connGone(sc.ctx.Conn()) }

func (sc *scratch) reset() {
	clear(sc.matches)
	clear(sc.applied)
	clear(sc.all)
	clear(sc.bypassed)
	clear(sc.after)
	clear(sc.afterChecks)
	clear(sc.decided[:cap(sc.decided)])
	sc.after, sc.afterChecks = sc.after[:0], sc.afterChecks[:0]
	sc.matches, sc.checks, sc.applied, sc.all = sc.matches[:0], sc.checks[:0], sc.applied[:0], sc.all[:0]
	sc.bypassed, sc.penalised, sc.refusal, sc.unread = sc.bypassed[:0], false, "", false
	sc.tier, sc.id, sc.upstream, sc.client = shedder.TierNone, "", 0, netip.Addr{}
	sc.trace, sc.span = nil, nil
	sc.ctx, sc.stage, sc.start, sc.peer, sc.trusted, sc.path = nil, 0, time.Time{}, netip.Addr{}, false, ""
	sc.host, sc.tenant, sc.pool, sc.paths = "", "", nil, hosts.PathPolicy{}
	sc.headers = headerLookup{}
	sc.bh, sc.req, sc.rider, sc.limitDenied, sc.denyRetry = bhlayer.Request{}, rules.Request{}, nil, false, 0
	sc.atEnd, sc.endHandedOn = nil, false
}

var scratchPool = sync.Pool{New: newScratch}
