package pipeline

import (
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// checksStage turns the matched rules into the limiter's checks (step 6,
// Checks): a rule whose bypass names the request is dropped (escapes.go),
// a rule that counts by the response is set aside until the response
// (response.go), and each other rule's check gets the key's override or a
// trusted peer's limit header (escapes.go) and is enforced or shadow as
// the rule and the region's switch say (enforcement.go).
func (e *Pipeline) checksStage(sc *scratch) string {
	sc.matches, sc.bypassed = e.dropBypassed(sc.matches, sc.bypassed)
	sc.matches, sc.after = splitAfter(sc.matches, sc.after)
	for _, m := range sc.after {
		sc.afterChecks = append(sc.afterChecks, e.check(m, sc.trusted, sc.header))
	}
	for _, m := range sc.matches {
		sc.checks = append(sc.checks, e.check(m, sc.trusted, sc.header))
	}
	return e.next(sc)
}

// check turns a matched rule into a limiter check, with the key's own
// limit if it has one (escapes.go), enforced or shadow as the rule and the
// region's switch say (enforcement.go).
func (e *Pipeline) check(m rules.Match, trusted bool, header func(string) (string, bool)) limiter.Check {
	r := m.Rule
	key, nodes := m.Key, e.nodesRegion.Load()
	if r.Scope == rules.ScopePoP {
		key, nodes = e.popKeyPrefix+key, e.nodesPoP.Load()
	}
	shadow := e.shadowed(r, m.Key)
	if shadow {
		e.metrics.enforce.shadow.Inc()
	} else {
		e.metrics.enforce.enforced.Inc()
	}
	return limiter.Check{Limit: e.limitOf(m, key, trusted, header), Cost: r.Cost, Shadow: shadow, Nodes: int(nodes), Tolerance: r.Tolerance, Global: r.Scope == rules.ScopeGlobal}
}

// ruleLimit is a compiled rule's limit on key (rules.CompiledRule.LimitOn).
func ruleLimit(r *rules.CompiledRule, key string) limiter.Limit { return r.LimitOn(key) }
