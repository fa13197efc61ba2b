package rules

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules/rulestest"
)

// allocated is the bytes and allocations of one call of f, in a test that
// runs nothing else.
func allocated(f func()) (bytes, allocs uint64) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc, m1.Mallocs - m0.Mallocs
}

// What reading any document may allocate, per byte of it and besides
// (FuzzDecodeBudget): about twice the most the shapes below take (an
// invalid rule of 3 bytes, "{},", costs about 750 bytes in 9
// allocations: the Rule, its node, its problems). Expanding aliases
// without a budget took 190 times this for the 122 KiB document.
const (
	allocBytesPerByte = 2048
	allocBytesBase    = 16 << 20
	allocsPerByte     = 24
	allocsBase        = 100_000
)

func requireBoundedRead(t *testing.T, src []byte) {
	t.Helper()
	bytes, allocs := allocated(func() { _, _ = Load(src) })
	require.LessOrEqual(t, bytes, uint64(allocBytesPerByte*len(src)+allocBytesBase),
		"reading %d bytes allocated %d bytes: more than a fixed multiple of its size", len(src), bytes)
	require.LessOrEqual(t, allocs, uint64(allocsPerByte*len(src)+allocsBase),
		"reading %d bytes made %d allocations: more than a fixed multiple of its size", len(src), allocs)
}

// The documents that made every edge of a region run out of memory: 4,000
// (and 15,000) rules merging one anchored list of as many path prefixes.
// Each is refused at the rule whose merge went past the budget, having
// decoded no more than the budget, and says why.
func TestAliasBombRefused(t *testing.T) {
	for name, src := range map[string][]byte{
		"122 KiB": rulestest.AliasBomb122K(),
		"477 KiB": rulestest.AliasBomb477K(),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(src)
			require.ErrorIs(t, err, ErrTooLarge)
			fes := FieldErrors(err)
			require.Len(t, fes, 1, "one problem: nothing after it is decoded nor validated")
			require.Contains(t, fes[0].Msg, fmt.Sprintf("more than %d values", decodeBudget(len(src))))
			require.Contains(t, fes[0].Msg, "each reuse of an anchor")
			// The line of the rule whose merge went over: rule rN is on line N+3.
			var n int
			_, scanErr := fmt.Sscanf(fes[0].RuleID, "r%d", &n)
			require.NoError(t, scanErr, "the problem names a rule: %v", fes[0])
			require.Equal(t, n+3, fes[0].Line)
			requireBoundedRead(t, src)
		})
	}
}

// The budget is exact: a document decoding to exactly its budget decodes,
// one more value is refused.
func TestDecodeBudgetBoundary(t *testing.T) {
	src := rulestest.AliasBomb(30, 40)
	root, err := parseTree(src)
	require.NoError(t, err)
	d := &decoder{budget: 1 << 30, size: len(src)}
	d.decode(root, reflectDoc())
	require.Empty(t, d.errs)
	used := 1<<30 - d.budget
	require.Greater(t, used, 30*40, "every expanded prefix is counted")

	d = &decoder{budget: used, size: len(src)}
	d.decode(root, reflectDoc())
	require.False(t, d.over)
	require.Empty(t, d.errs)

	d = &decoder{budget: used - 1, size: len(src)}
	d.decode(root, reflectDoc())
	require.True(t, d.over)
	require.Len(t, d.errs, 1)
	require.ErrorIs(t, d.errs[0], ErrTooLarge)
}

// Anchors and merge keys used as people use them still read: one list of
// 500 customer hosts, anchored in the first rule, shared by 200 rules that
// each merge a base.
func TestDecodeBudgetKeepsReuse(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nrules:\n  - {id: hosts, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, match: {hosts: &h [")
	for i := range 500 {
		fmt.Fprintf(&b, "c%d.example.com, ", i)
	}
	b.WriteString("]}}\n  - &base {id: r0, key: [ip], algorithm: sliding_window, limit: 100, window: 1m, match: {hosts: *h}}\n")
	for i := 1; i < 200; i++ {
		fmt.Fprintf(&b, "  - {<<: *base, id: r%d, key: [ip, \"header:X-K%d\"], match: {hosts: *h, path_prefix: [/v%d]}}\n", i, i, i)
	}
	src := b.String()
	doc, err := Parse([]byte(src))
	require.NoError(t, err)
	require.Len(t, doc.Rules, 201)
	require.Len(t, doc.Rules[200].Match.Hosts, 500)
	require.Greater(t, 201*500, len(src), "more hosts than bytes: reuse is what the budget allows")
}

// Each limit holds at its value and refuses one more, with a problem
// naming it, through Validate (which Parse, Merge and Compile call).
func TestDocumentLimits(t *testing.T) {
	many := func(n int, f func(int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		limit int
		build func(d *Document, n int)
		what  string
	}{
		{"hosts", MaxHosts, func(d *Document, n int) {
			d.Rules[0].Match.Hosts = many(n/2, func(i int) string { return fmt.Sprintf("h%d.example.com", i) })
			d.Rules[1].Bypass.Hosts = many(n-n/2, func(i int) string { return fmt.Sprintf("b%d.example.com", i) })
		}, "hosts (match.hosts and bypass.hosts of all rules)"},
		{"path prefixes", MaxPathPrefixes, func(d *Document, n int) {
			d.Rules[0].Match.PathPrefix = many(n/2, func(i int) string { return fmt.Sprintf("/p%d", i) })
			d.Rules[1].Bypass.PathPrefix = many(n-n/2, func(i int) string { return fmt.Sprintf("/b%d", i) })
		}, "path prefixes (match.path_prefix and bypass.path_prefix of all rules)"},
		{"overrides", MaxOverrides, func(d *Document, n int) {
			for k, r := range []*Rule{&d.Rules[0], &d.Rules[1]} {
				r.Key = []string{"header:X-Customer"}
				r.Overrides = make(Overrides, []int{n / 2, n - n/2}[k])
				for i := range r.Overrides {
					r.Overrides[i] = Override{Key: []string{fmt.Sprintf("c%d", i)}, Limit: 5}
				}
			}
		}, "overrides (of all rules)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{tc.limit, tc.limit + 1} {
				d := &Document{Version: SchemaVersion, Rules: []Rule{validRule("a"), validRule("b")}}
				tc.build(d, n)
				err := d.Validate()
				if n == tc.limit {
					require.NoError(t, err)
					continue
				}
				require.ErrorIs(t, err, ErrTooLarge)
				require.ErrorContains(t, err, fmt.Sprintf("%d %s, more than the %d a document may hold", n, tc.what, tc.limit))
			}
		})
	}
}

// A rules list longer than MaxRules is refused before it is made, as a
// block list (cut in pieces: by its item lines, before any parse) and as
// a flow list (in the decoder, before the rules are allocated).
func TestTooManyRules(t *testing.T) {
	require.Nil(t, tooManyRules(MaxRules, 0))
	n := MaxRules + 1
	for name, src := range map[string]string{
		"block": "version: 1\nrules:\n" + strings.Repeat("  - {}\n", n),
		"flow":  "version: 1\nrules: [" + strings.Repeat("{},", n) + "]\n",
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			bytes, _ := allocated(func() { _, err = Parse([]byte(src)) })
			require.ErrorIs(t, err, ErrTooLarge)
			require.ErrorContains(t, err, fmt.Sprintf("%d rules, more than the %d a document may hold", n, MaxRules))
			require.Less(t, bytes, uint64(n)*uint64(ruleType.Size()), "the rules were never allocated")
		})
	}
}

// A document with more problems than MaxProblems lists the first ones in
// the text and counts the rest, in one piece or many.
func TestProblemsListedAreBounded(t *testing.T) {
	defer func(old int) { pieceSize = old }(pieceSize)
	pieceSize = 16 << 10
	for name, item := range map[string]func(int) string{
		"decode":   func(i int) string { return fmt.Sprintf("  - {id: r%d, colour: red}\n", i) },
		"validate": func(i int) string { return fmt.Sprintf("  - {id: r%d}\n", i) },
	} {
		t.Run(name, func(t *testing.T) {
			src := bigRules("version: 1\nrules:\n", "", 3000, item)
			require.NotNil(t, splitRules([]byte(src)), "cut in pieces")
			_, err := Parse([]byte(src))
			fes := FieldErrors(err)
			require.Len(t, fes, MaxProblems+1)
			require.Equal(t, 3, fes[0].Line, "the first problems of the text are listed")
			require.Equal(t, "r0", fes[0].RuleID)
			last := fes[MaxProblems]
			require.Regexp(t, `^and \d+ more problems, not listed$`, last.Msg)
			var more int
			_, _ = fmt.Sscanf(last.Msg, "and %d more", &more)
			all := allProblems(t, src)
			require.Equal(t, all-MaxProblems, more, "the count of those left out is exact")
		})
	}
}

// allProblems is how many problems src has, counted one rule at a time.
func allProblems(t *testing.T, src string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(src, "\n") {
		if !strings.HasPrefix(line, "  - ") {
			continue
		}
		_, err := Parse([]byte("version: 1\nrules:\n" + line + "\n"))
		n += len(FieldErrors(err))
	}
	return n
}

func reflectDoc() reflect.Value { return reflect.ValueOf(&Document{}).Elem() }

// FuzzDecodeBudget holds reading any document (Load: parse, validate,
// compile) to a fixed multiple of its size in bytes allocated and in
// allocations. The seeds are the shapes that cost the most per byte.
func FuzzDecodeBudget(f *testing.F) {
	rep := strings.Repeat
	var hosts, ovr strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&hosts, "h%d.example.com, ", i)
	}
	for i := range 300 {
		fmt.Fprintf(&ovr, "  - {id: b%d, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, overrides: *o}\n", i)
	}
	for _, seed := range [][]byte{
		rulestest.AliasBomb122K(),
		rulestest.AliasBomb(6000, 80), // just within the budget: valid, and loads
		rulestest.AliasBomb(40, 40),
		[]byte("version: 1\nrules: [" + rep("{},", 20000) + "]\n"),
		[]byte("version: 1\nrules:\n" + rep("- {}\n", 20000)),
		[]byte("version: 1\nrules:\n  - {id: a, key: [" + rep("a,", 50000) + "]}\n"),
		[]byte("version: 1\nrules:\n" + rep("  - {zz: 1, yy: 2}\n", 5000)),
		[]byte("version: 1\nrules: " + rep("[", 5000) + rep("]", 5000) + "\n"),
		[]byte("version: 1\nrules:\n  - &a {id: a}\n  - {<<: [" + rep("*a,", 3000) + "*a]}\n"),
		[]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, match: {hosts: [" + hosts.String() + "]}}\n"),
		[]byte("version: 1\nrules:\n  - {id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, overrides: &o [" + rep("{key: [a], limit: 1},", 2000) + "]}\n" + ovr.String()),
		[]byte("version: 1\nrules:\n  - &b {id: r0, key: [ip], algorithm: fixed_window, limit: 5, window: 1s, match: {path_prefix: &p [" + rep("x, ", 2000) + "]}}\n" + rep("  - {<<: *b, match: {path_prefix: *p}}\n", 2000)),
		[]byte("version: 1\nbehaviour: &x {mode: shadow}\nrules: []\n"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		requireBoundedRead(t, src)
	})
}

// Validate, too, lists the first MaxProblems problems of each run of rules
// it checks in turn, and counts the others.
func TestValidateListsBoundedProblems(t *testing.T) {
	d := &Document{Version: SchemaVersion}
	for i := range 3000 {
		d.Rules = append(d.Rules, Rule{ID: fmt.Sprintf("r%d", i), Cost: 1}) // 4 problems each
	}
	fes := FieldErrors(d.Validate())
	require.Len(t, fes, MaxProblems+1)
	require.Equal(t, "r0", fes[0].RuleID)
	require.Equal(t, fmt.Sprintf("and %d more problems, not listed", 4*3000-MaxProblems), fes[MaxProblems].Msg)
}
