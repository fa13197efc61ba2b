package pipeline

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// shedStage decides whether the edge takes the request on (step 4, Shed),
// before any I/O, by its host and priority tier: a request of a host at
// its fair share of the workers while others want theirs waits for a
// place in it, up to host_share.queue_timeout, holding no worker, and is
// refused (503 host_share) if none frees (never a critical request); then the worker-utilization
// shedder may drop it (503; not a host within its share while another
// host is held to its own, whose load that is); otherwise it takes a worker slot (waiting briefly in a
// bounded queue, or 503) and, with the adaptive origin limit on, an origin
// slot. Both are held until the rest of the pipeline returns.
func (e *Pipeline) shedStage(sc *scratch) string {
	ctx, tier := sc.ctx, sc.tier
	// The host's tenant (sc.tenant, set by identify: the host table's entry
	// for it, the pooled rest for a host the table does not list, the host
	// itself with no table) is of the host normalised as the rules do, so
	// no spelling of a host (case, port, trailing dot) lands in another
	// host's share or escapes its own, and a client sending many names
	// the table does not list takes one share (unless
	// host_share.unlisted_hosts is "each": HostShareName). The
	// client is the one the trust model names (an IPv6 client by its
	// prefix, as the rules key it), so one address cannot take its host's
	// whole share from the host's other clients.
	// A request over its host's share waits (host_share.queue_timeout, no
	// worker held) for a place in it before it is refused: a client
	// retrying at once costs the edge one refusal per wait, not one per
	// round trip. Not ctx as a context (see the worker wait below); a
	// waiter whose client left gives up its place.
	sc.connGone = e.conns.Gone
	gone := sc.gone
	lease, err := e.shed.AcquireHostWait(context.Background(), sc.start, e.shed.HostShareName(sc.host, sc.tenant), e.clientIdentity(sc.client), tier, gone)
	switch {
	case errors.Is(err, shedder.ErrGone):
		ctx.SetConnectionClose()
		problem.Unavailable(ctx, "the client left while waiting", 1)
		return outcomeAbandoned
	case err != nil:
		problem.Unavailable(ctx, "this host is at its share of the edge's workers; retry later", 1)
		return outcomeHostShare
	}
	defer lease.Release()
	if lease.Exempt() {
		e.shed.AdmitExempt(tier)
	} else if !e.shed.Admit(sc.start, tier) {
		problem.Unavailable(ctx, "the edge is shedding load; retry later", 1)
		return outcomeShed
	}
	return e.holdPool(sc, gone, lease.Owed())
}

// holdPool, holdWorker and holdOrigin take the rest of what shedStage
// holds, each slot in a function of its own: with one defer and a few
// returns each, the compiler open-codes the defers, where four in one
// function with a dozen returns went through the runtime's defer records
// on every request.
func (e *Pipeline) holdPool(sc *scratch, gone func() bool, owed time.Duration) string {
	if !sc.pool.Limited() { // the usual case: nothing to take or give back
		return e.holdWorker(sc, gone, owed)
	}
	ctx, tier := sc.ctx, sc.tier
	// The host's pool's concurrency limit (host table `concurrency`; none
	// unless set), waited for before a worker is taken: requests queued
	// behind a slow pool hold none of the edge's workers.
	releasePool, err := sc.pool.AcquireLimit(sc.start, tier, gone)
	switch {
	case errors.Is(err, shedder.ErrGone):
		ctx.SetConnectionClose()
		problem.Unavailable(ctx, "the client left while waiting", 1)
		return outcomeAbandoned
	case err != nil:
		problem.Unavailable(ctx, "this host's origin is at its concurrency limit; retry later", 1)
		return outcomePoolLimit
	}
	defer endPool(releasePool, sc)
	return e.holdWorker(sc, gone, owed)
}

// holdWorker takes a worker; a request its host's share owes one (owed,
// HostLease.Owed) waits ahead of its tier's other waiters, and longer.
func (e *Pipeline) holdWorker(sc *scratch, gone func() bool, owed time.Duration) string {
	ctx, tier := sc.ctx, sc.tier
	// Not ctx: fasthttp's RequestCtx as a context costs a goroutine per
	// derived context and races with Shutdown; the queue timeout bounds
	// this, and a waiter whose client left gives up its place.
	_, wait := e.tracing.child(sc.trace, "shedder.wait")
	slot, err := e.workers.TakeOwed(context.Background(), tier, gone, owed)
	wait.End()
	switch {
	case errors.Is(err, shedder.ErrGone):
		ctx.SetConnectionClose()
		problem.Unavailable(ctx, "the client left while waiting", 1)
		return outcomeAbandoned
	case err != nil:
		problem.Unavailable(ctx, "no worker free; retry later", 1)
		return outcomeNoWorker
	}
	defer slot.Release()
	return e.holdOrigin(sc)
}

func (e *Pipeline) holdOrigin(sc *scratch) string {
	ctx, tier := sc.ctx, sc.tier
	// Adaptive origin limit (off unless the shedder settings enable it):
	// learned from the origin's latency, released when the exchange ends.
	// Taken before the limiter so a refusal costs no Redis call; the slot
	// is held through the decision, a millisecond against the origin's
	// tens.
	if !e.shed.AcquireOrigin(sc.start, tier) {
		problem.Unavailable(ctx, "the origin is at its learned concurrency limit; retry later", 1)
		return outcomeShed
	}
	defer func() { e.shed.ReleaseOrigin(time.Now(), tier, sc.upstream, originAnswered(ctx, sc)) }()
	return e.next(sc)
}

// originAnswered says whether the exchange measured the origin's latency:
// it was proxied and did not fail for want of a connection (502, 503 from
// the proxy), which would read as a fast answer.
func originAnswered(ctx *fasthttp.RequestCtx, sc *scratch) bool {
	code := ctx.Response.StatusCode()
	return sc.upstream > 0 && code != fasthttp.StatusBadGateway && code != fasthttp.StatusServiceUnavailable
}

// clientIdentity is the address a client is known by: an IPv6 client's
// --ipv6-prefix network, as the rules and the connection cap key it.
func (e *Pipeline) clientIdentity(a netip.Addr) netip.Addr {
	if !a.Is6() || a.Is4In6() {
		return a.Unmap()
	}
	bits := e.cfg.IPv6Prefix
	if bits <= 0 {
		bits = rules.DefaultIPv6Prefix
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// endPool gives back sc's place in its pool's concurrency limit, with the
// origin's latency when it measured the origin.
func endPool(release func(time.Time, time.Duration, bool), sc *scratch) {
	release(time.Now(), sc.upstream, originAnswered(sc.ctx, sc))
}
