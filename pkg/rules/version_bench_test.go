package rules

import (
	"fmt"
	"testing"
)

// Version of host rules: every rule has match lists, a key and a limit.
func BenchmarkVersionHostRules(b *testing.B) {
	for _, n := range hostRuleCounts {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			doc, err := Parse(hostRulesYAML(n))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				DocumentVersion(doc)
			}
		})
	}
}
