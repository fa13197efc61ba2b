package rules

import (
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// checkMarshal requires what Marshal writes to read back as doc, by
// yaml.v3's decoder and (for a document that validates) by Parse.
func checkMarshal(t *testing.T, doc *Document) {
	t.Helper()
	out, err := Marshal(doc)
	require.NoError(t, err)
	var back Document
	require.NoError(t, yaml.Unmarshal(out, &back), "%s", out)
	want := &Document{}
	if doc != nil {
		want = doc
	}
	require.Equal(t, withoutEmptyLists(want), withoutEmptyLists(&back), "read back differently:\n%s", out)
	if want.clone().Validate() == nil {
		parsed, err := Parse(out)
		require.NoError(t, err, "%s", out)
		require.Equal(t, DocumentVersion(want), DocumentVersion(parsed))
	}
}

// withoutEmptyLists is d with empty lists nil: Marshal leaves them out.
func withoutEmptyLists(d *Document) *Document {
	d = d.clone()
	nilIfEmpty := func(s *[]string) {
		if len(*s) == 0 {
			*s = nil
		}
	}
	for i := range d.Rules {
		r := &d.Rules[i]
		nilIfEmpty(&r.Key)
		nilIfEmpty(&r.Match.Hosts)
		nilIfEmpty(&r.Match.PathPrefix)
		nilIfEmpty(&r.Match.Methods)
	}
	if len(d.Rules) == 0 {
		d.Rules = nil
	}
	return d
}

// What Marshal writes reads back as the document it was given: the
// examples, their merged rules, documents with strings YAML would read as
// something else, and random documents.
func TestMarshalReadsBack(t *testing.T) {
	docs := map[string]string{"hosts": string(hostRulesYAML(200)), "full rule": fullRule, "ten rules": benchRules, "match rules": matchRules}
	for _, f := range []string{"rules.yaml", "rules-cdn.yaml", "rules-cdn-region.yaml", "rules-behaviour.yaml"} {
		data, err := os.ReadFile("../../examples/" + f)
		require.NoError(t, err)
		docs["examples/"+f] = string(data)
	}
	for name, src := range docs {
		t.Run(name, func(t *testing.T) {
			doc := mustParse(t, src)
			merged, err := Merge(doc, nil)
			require.NoError(t, err)
			checkMarshal(t, doc)
			checkMarshal(t, merged)
		})
	}

	rule := func(id string) Rule {
		return Rule{ID: id, Key: []string{"ip"}, Algorithm: "fixed_window", Limit: 5, Window: Duration(time.Second)}
	}
	for _, tc := range []struct {
		name string
		doc  *Document
	}{
		{"nil", nil},
		{"no rules", &Document{Version: 1}},
		{"empty rules", &Document{Version: 1, Rules: []Rule{}}},
		{"empty lists", &Document{Version: 1, Rules: []Rule{{ID: "a", Key: []string{}, Match: MatchSpec{Hosts: []string{}}}}}},
		{"every field", &Document{Version: 1, Rules: []Rule{{
			ID: "a", Match: MatchSpec{Hosts: []string{"*.x.example", "x.example"}, PathPrefix: []string{"/", "/a/b"}, Methods: []string{"GET"}},
			Key: []string{"ip", "header:X-Api-Key", "query:q"}, Algorithm: "token_bucket", Limit: -5, Window: Duration(90 * time.Second),
			Burst: 3, Cost: 2, MinInterval: Duration(250 * time.Millisecond), Shadow: true, Scope: "pop", Disabled: true, Behaviour: true,
		}}}},
		{"behaviour section", &Document{Version: 1, Behaviour: &behavior.Settings{Mode: behavior.ModeShadow}, Rules: []Rule{rule("a")}}},
		{"disabled", &Document{Version: 1, Rules: []Rule{{ID: "a", Disabled: true}}}},
		{"strings yaml.v3 quotes", &Document{Version: 1, Rules: []Rule{rule("yes")}}},
		{"number as id", &Document{Version: 1, Rules: []Rule{rule("123")}}},
		{"empty id", &Document{Version: 1, Rules: []Rule{rule("")}}},
		{"leading dash", &Document{Version: 1, Rules: []Rule{rule("-a")}}},
		{"space", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{PathPrefix: []string{"/a b"}}}}}},
		{"colon space", &Document{Version: 1, Rules: []Rule{{ID: "a", Key: []string{"a: b"}}}}},
		{"non-ASCII", &Document{Version: 1, Rules: []Rule{{ID: "é"}}}},
		{"invalid UTF-8", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{PathPrefix: []string{"/\xff"}}}}}},
		{"microseconds", &Document{Version: 1, Rules: []Rule{{ID: "a", Window: Duration(time.Microsecond)}}}},
		{"negative duration", &Document{Version: 1, Rules: []Rule{{ID: "a", Window: -Duration(time.Second)}}}},
		{"null", &Document{Version: 1, Rules: []Rule{{ID: "null"}}}},
		{"wildcard of a number", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{Hosts: []string{"*.1.2"}}}}}},
		{"trailing colon", &Document{Version: 1, Rules: []Rule{{ID: "a:"}}}},
		{"base 60", &Document{Version: 1, Rules: []Rule{{ID: "1:20"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkMarshal(t, tc.doc)
		})
	}

	// Every document yaml.v3 decodes from the random documents of the
	// decoder's test, valid or not.
	rng := rand.New(rand.NewPCG(17, 18))
	for range randomDocs {
		if doc := yamlDecode(randomYAML(rng)); doc != nil {
			checkMarshal(t, doc)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

// FuzzMarshalReadsBack: whatever the strings and numbers, what Marshal
// writes reads back as the document.
func FuzzMarshalReadsBack(f *testing.F) {
	f.Add("per-ip", "*.example.com", "/api", "header:X-Api-Key", int64(time.Minute), int64(5))
	f.Add("yes", "1.2.3.4", "/a b", "a: b", int64(-1), int64(0))
	f.Add("1s", "*.-x", "/x #y", "query:1", int64(1500), int64(-3))
	f.Fuzz(func(t *testing.T, id, host, prefix, key string, window, limit int64) {
		doc := &Document{Version: 1, Rules: []Rule{{
			ID: id, Match: MatchSpec{Hosts: []string{host}, PathPrefix: []string{prefix}}, Key: []string{key},
			Algorithm: Algorithm(key), Limit: limit, Window: Duration(window), Scope: Scope(host),
		}}}
		checkMarshal(t, doc)
	})
}
