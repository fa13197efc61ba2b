package rules

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// validRule is a minimal rule that passes Validate; tests mutate copies.
func validRule(id string) Rule {
	return Rule{
		ID:        id,
		Key:       []string{"ip"},
		Algorithm: "sliding_log",
		Limit:     100,
		Window:    Duration(time.Minute),
		Cost:      1,
	}
}

func mustParse(t testing.TB, src string) *Document {
	t.Helper()
	doc, err := Parse([]byte(src))
	require.NoError(t, err)
	return doc
}

func mustCompile(t testing.TB, doc *Document, opts ...CompileOption) *Snapshot {
	t.Helper()
	s, err := Compile(doc, opts...)
	require.NoError(t, err)
	return s
}
