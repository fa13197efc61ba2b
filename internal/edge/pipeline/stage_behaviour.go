package pipeline

// behaviourStage applies the client's level to the request (step 8,
// Behaviour; package bhlayer has the layer). Only requests that matched rules
// are observed. In enforce mode a level may block the client (429
// abnormal-usage-detected) or multiply its opted-in rules' limits; the
// request's signal update rides with the limit checks, and once the rest
// of the pipeline returns, an update that did not ride and a 429 of the
// limiter go to the layer's next flush.
func (e *Pipeline) behaviourStage(sc *scratch) string {
	if len(sc.matches) == 0 {
		return e.next(sc)
	}
	obs, early, block := e.bh.Apply(sc.ctx, &sc.bh, sc.matches, sc.checks)
	if block {
		e.bh.Block(sc.ctx, &sc.bh)
		return outcomeDenied
	}
	sc.rider = e.bh.Rider(&sc.bh, obs)
	outcome := e.next(sc)
	e.bh.Done(&sc.bh, obs, early, sc.rider, sc.limitDenied, sc.denyRetry)
	return outcome
}
