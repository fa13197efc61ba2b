package edge

// behaviourStage applies the client's level to the request (step 8,
// Behaviour; behaviour.go has the layer). Only requests that matched rules
// are observed. In enforce mode a level may block the client (429
// abnormal-usage-detected) or multiply its opted-in rules' limits; the
// request's signal update rides with the limit checks, and once the rest
// of the pipeline returns, an update that did not ride and a 429 of the
// limiter go to the layer's next flush.
func (e *Edge) behaviourStage(sc *scratch) string {
	if len(sc.matches) == 0 {
		return e.next(sc)
	}
	obs, early, block := e.bh.apply(sc.ctx, &sc.bh, sc.matches, sc.checks)
	if block {
		blocked(sc.ctx, sc.bh.cfg.params.Cooldown())
		return outcomeDenied
	}
	sc.rider = e.bh.rider(&sc.bh, obs)
	outcome := e.next(sc)
	e.bh.done(&sc.bh, obs, early, sc.rider, sc.limitDenied, sc.denyRetry)
	return outcome
}
