package rules

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// yamlEncode is what Marshal must write: yaml.v3's encoder, two-space indent.
func yamlEncode(t *testing.T, doc *Document) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	require.NoError(t, enc.Encode(doc))
	require.NoError(t, enc.Close())
	return b.Bytes()
}

// checkMarshal requires Marshal to write yaml.v3's bytes, and reports
// whether it wrote them itself.
func checkMarshal(t *testing.T, doc *Document) bool {
	t.Helper()
	got, err := Marshal(doc)
	require.NoError(t, err)
	require.Equal(t, string(yamlEncode(t, doc)), string(got))
	_, fast := appendDocument(nil, doc)
	return fast
}

// Marshal writes the bytes yaml.v3 writes; for validated documents it
// writes them itself, in the subset the scanner reads back.
func TestMarshalLikeYAML(t *testing.T) {
	docs := map[string]string{"hosts": string(hostRulesYAML(200)), "full rule": fullRule, "ten rules": benchRules, "match rules": matchRules}
	for _, f := range []string{"rules.yaml", "rules-cdn.yaml", "rules-cdn-region.yaml"} {
		data, err := os.ReadFile("../../examples/" + f)
		require.NoError(t, err)
		docs["examples/"+f] = string(data)
	}
	for name, src := range docs {
		t.Run(name, func(t *testing.T) {
			doc := mustParse(t, src)
			merged, err := Merge(doc, nil)
			require.NoError(t, err)
			for _, d := range []*Document{doc, merged} {
				require.True(t, checkMarshal(t, d), "written by hand")
				out, err := Marshal(d)
				require.NoError(t, err)
				back := scanDocument(out)
				require.NotNil(t, back, "the scanner reads it back:\n%s", out)
				require.Equal(t, DocumentVersion(d), DocumentVersion(back))
			}
		})
	}

	rule := func(id string) Rule {
		return Rule{ID: id, Key: []string{"ip"}, Algorithm: "fixed_window", Limit: 5, Window: Duration(time.Second)}
	}
	for _, tc := range []struct {
		name string
		doc  *Document
		fast bool
	}{
		{"nil", nil, false},
		{"no rules", &Document{Version: 1}, true},
		{"empty rules", &Document{Version: 1, Rules: []Rule{}}, true},
		{"empty lists", &Document{Version: 1, Rules: []Rule{{ID: "a", Key: []string{}, Match: MatchSpec{Hosts: []string{}}}}}, true},
		{"every field", &Document{Version: 1, Rules: []Rule{{
			ID: "a", Match: MatchSpec{Hosts: []string{"*.x.example", "x.example"}, PathPrefix: []string{"/", "/a/b"}, Methods: []string{"GET"}},
			Key: []string{"ip", "header:X-Api-Key", "query:q"}, Algorithm: "token_bucket", Limit: -5, Window: Duration(90 * time.Second),
			Burst: 3, Cost: 2, MinInterval: Duration(250 * time.Millisecond), Shadow: true, Scope: "pop", Disabled: true, Behaviour: true,
		}}}, true},
		{"behaviour section", &Document{Version: 1, Behaviour: &behavior.Settings{Mode: behavior.ModeShadow}, Rules: []Rule{rule("a")}}, false},
		{"disabled", &Document{Version: 1, Rules: []Rule{{ID: "a", Disabled: true}}}, true},
		{"strings yaml.v3 quotes", &Document{Version: 1, Rules: []Rule{rule("yes")}}, false},
		{"number as id", &Document{Version: 1, Rules: []Rule{rule("123")}}, false},
		{"empty id", &Document{Version: 1, Rules: []Rule{rule("")}}, false},
		{"leading dash", &Document{Version: 1, Rules: []Rule{rule("-a")}}, false},
		{"space", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{PathPrefix: []string{"/a b"}}}}}, false},
		{"colon space", &Document{Version: 1, Rules: []Rule{{ID: "a", Key: []string{"a: b"}}}}, false},
		{"non-ASCII", &Document{Version: 1, Rules: []Rule{{ID: "é"}}}, false},
		{"invalid UTF-8", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{PathPrefix: []string{"/\xff"}}}}}, false},
		{"microseconds", &Document{Version: 1, Rules: []Rule{{ID: "a", Window: Duration(time.Microsecond)}}}, false},
		{"negative duration", &Document{Version: 1, Rules: []Rule{{ID: "a", Window: -Duration(time.Second)}}}, false},
		{"null", &Document{Version: 1, Rules: []Rule{{ID: "null"}}}, false},
		{"wildcard of a number", &Document{Version: 1, Rules: []Rule{{ID: "a", Match: MatchSpec{Hosts: []string{"*.1.2"}}}}}, false},
		{"trailing colon", &Document{Version: 1, Rules: []Rule{{ID: "a:"}}}, false},
		{"base 60", &Document{Version: 1, Rules: []Rule{{ID: "1:20"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.fast, checkMarshal(t, tc.doc), "written by hand")
		})
	}

	// Every document yaml.v3 decodes from the random documents of the
	// scanner's test, valid or not.
	rng := rand.New(rand.NewPCG(17, 18))
	var fast, slow int
	for range randomDocs {
		doc := yamlDecode(randomYAML(rng))
		if doc == nil {
			continue
		}
		if checkMarshal(t, doc) {
			fast++
		} else {
			slow++
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	t.Logf("random documents: %d written by hand, %d by yaml.v3", fast, slow)
	require.Greater(t, fast, randomDocs/20)
	require.Greater(t, slow, randomDocs/200)
}

// FuzzMarshalLikeYAML: whatever the strings and numbers, Marshal writes
// yaml.v3's bytes.
func FuzzMarshalLikeYAML(f *testing.F) {
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
