package pipeline

import (
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// matchStage asks the current rules snapshot for every rule that applies,
// each with its key (step 5, Match: pure code, no I/O). What the rules see
// is what the origin receives: the host the screen settled on, the method,
// the normalized path.
func (e *Pipeline) matchStage(sc *scratch) string {
	ctx := sc.ctx
	sc.req = rules.Request{
		Host:     sc.host, // the one the origin gets (screen)
		Method:   b2s(ctx.Method()),
		Path:     sc.path,
		ClientIP: sc.client,
		Header:   sc.header,
		Query:    sc.query,
		JA4:      e.conns.JA4(ctx.Conn()),
	}
	sc.matches = e.rules.Load().Match(&sc.req, sc.matches)
	return e.next(sc)
}
