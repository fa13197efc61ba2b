package pipeline

import (
	"github.com/edgeguard/edgeguard/internal/edge/reqhead"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// identifyStage says who is asking and how much it matters (step 3,
// Identify): the client address (from X-Forwarded-For only through a
// trusted proxy: internal/edge/trust), with a behaviour section in the rules the
// client's identity and level (package bhlayer), and the request's priority
// tier for the shedder (a client whose level says so is put in the lowest).
func (e *Pipeline) identifyStage(sc *scratch) string {
	ctx := sc.ctx
	sc.headers = reqhead.New(&ctx.Request.Header, ctx.QueryArgs())
	sc.path = rules.NormalizePath(b2s(ctx.Request.URI().PathOriginal()))
	sc.client = trust.Client(sc.peer, ctx.Request.Header.PeekAll("X-Forwarded-For"), e.trusted)
	sc.bh = e.bh.Begin(sc.client, sc.trusted, sc.header, sc.query, sc.path, ctx.Conn())
	sc.tier = e.bh.Tier(&sc.bh, e.shed.Classify(b2s(ctx.Method()), sc.path, sc.header, sc.trusted))
	return e.next(sc)
}
