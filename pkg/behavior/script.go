package behavior

import (
	"fmt"
	"strconv"
)

// Keys are the Redis keys of a client's state, all under the hash tag of
// its identity (one slot: the script is atomic over them): the state hash
// and the route sketches of the two horizon halves.
func Keys(prefix, id string) []string {
	base := prefix + "{bh:" + id + "}"
	return []string{base, base + ":r0", base + ":r1"}
}

// maxFlushRoutes is how many routes one update carries for requests that
// did not reach Redis on their own (an edge's batch of them).
const maxFlushRoutes = 8

// ScriptArgs builds lua/behaviour.lua's arguments from p once; Args adds
// an update's.
type ScriptArgs struct{ fixed []any }

// NewScriptArgs precomputes p's part of the arguments.
func NewScriptArgs(p *Params) ScriptArgs {
	th := func(f float64) []any {
		return []any{p.thMilli(Elevated, f), p.thMilli(Suspicious, f), p.thMilli(Blocked, f)}
	}
	fixed := []any{p.W[0], p.W[1], p.W[2], p.W[3],
		p.BurstFree, p.BurstSpan, p.ReplayFree, p.ReplaySpan, p.ScanFree, p.ScanSpan, p.DenialFree, p.DenialSpan}
	fixed = append(fixed, th(1)...)
	fixed = append(fixed, th(p.Hysteresis)...)
	head := []any{p.HorizonMs, p.BurstMs, p.CooldownMs, p.ReplayGapMs}
	return ScriptArgs{fixed: append(head, fixed...)}
}

// Args are the script's ARGV for o at now (ms; 0: Redis's clock).
func (a ScriptArgs) Args(o Obs, now int64) []any {
	out := make([]any, 0, 11+len(a.fixed)+len(o.Routes))
	out = append(out, now)
	out = append(out, a.fixed[:4]...)
	fp := ""
	if o.FP != 0 {
		fp = strconv.FormatUint(o.FP, 16)
	}
	out = append(out, o.N, o.Judge, o.Early, o.RetryMs, o.Q, fp)
	out = append(out, a.fixed[4:]...)
	for _, r := range o.Routes {
		out = append(out, strconv.FormatUint(r, 16))
	}
	return out
}

// ParseReply reads the script's reply.
func ParseReply(v []int64) (Verdict, error) {
	if len(v) != 7 {
		return Verdict{}, fmt.Errorf("behaviour script returned %d values, want 7", len(v))
	}
	if v[0] < 0 || v[0] >= int64(numLevels) {
		return Verdict{}, fmt.Errorf("behaviour script returned level %d", v[0])
	}
	return Verdict{
		Level: Level(v[0]), Score: v[1], HoldMs: v[2],
		Raw: Raw{Burst: float64(v[3]) / 1000, Replay: v[4], Scan: v[5], Denial: v[6]},
	}, nil
}
