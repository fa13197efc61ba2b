// Package rulestest makes rules documents for tests of the packages that
// read them: documents that cost more to read than their size says.
package rulestest

import (
	"strconv"
	"strings"
)

// AliasBomb is a valid-looking rules document of rules rules that share one
// anchored list of prefixes path prefixes: the first rule is anchored
// ("&b") and every other merges it ("<<: *b") with an id of its own, so a
// reader that expands every reuse decodes rules × prefixes path prefixes
// from a text of about 8 × prefixes + 25 × rules bytes.
func AliasBomb(rules, prefixes int) []byte {
	var b strings.Builder
	b.Grow(8*prefixes + 25*rules + 128)
	b.WriteString("version: 1\nrules:\n  - &b {id: r0, key: [ip], algorithm: fixed_window, limit: 5, window: 1s, match: {path_prefix: [")
	for i := range prefixes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("/p" + strconv.Itoa(i))
	}
	b.WriteString("]}}\n")
	for i := 1; i < rules; i++ {
		b.WriteString("  - {<<: *b, id: r" + strconv.Itoa(i) + "}\n")
	}
	return []byte(b.String())
}

// The two documents of the report that made the rules decoder count what
// it expands: 4,000 rules sharing 4,000 prefixes (122 KiB, 16 million
// prefixes expanded), and 15,000 sharing 15,000 (477 KiB, under Consul's
// 512 KiB value limit, 225 million).
func AliasBomb122K() []byte { return AliasBomb(4000, 4000) }
func AliasBomb477K() []byte { return AliasBomb(15000, 15000) }
