package rules

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const versionBase = `
version: 1
rules:
  - id: per-ip
    match: {hosts: ["api.example.com", "*.example.com"], path_prefix: ["/api", "/admin"], methods: ["GET", "POST"]}
    key: [ip, "header:X-API-Key"]
    algorithm: token_bucket
    limit: 100
    window: 1m
  - id: other
    key: [host]
    algorithm: sliding_log
    limit: 5
    window: 10s
`

func TestVersionStableAcrossFormatting(t *testing.T) {
	base := Version(mustParse(t, versionBase))
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{12}$`), base)

	same := map[string]string{
		"reordered fields, rules and lists, other spellings": `
# comment
rules:
- algorithm: sliding_log
  window: 10000ms
  limit: 5
  key: ["host"]
  id: other
  cost: 1
  scope: region
- window: 60s
  id: per-ip
  algorithm: token_bucket
  limit: 100
  burst: 100
  key:
    - ip
    - header:x-api-key
  match:
    methods: [post, get]
    path_prefix: ["/admin/", "//api"]
    hosts: ["*.EXAMPLE.com", "API.example.com."]
  shadow: false
version: 1
`,
		"flow style":          `{version: 1, rules: [{id: other, key: [host], algorithm: sliding_log, limit: 5, window: 10s}, {id: per-ip, match: {hosts: [api.example.com, "*.example.com"], path_prefix: [/api, /admin], methods: [GET, POST]}, key: [ip, "header:X-API-Key"], algorithm: token_bucket, limit: 100, window: 1m}]}`,
		"extra disabled rule": versionBase + "  - {id: gone, disabled: true}\n",
	}
	for name, src := range same {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, base, Version(mustParse(t, src)))
		})
	}
}

func TestVersionSensitiveToSemantics(t *testing.T) {
	base := mustParse(t, versionBase)
	baseVersion := Version(base)
	changes := map[string]func(r *Rule){
		"id":              func(r *Rule) { r.ID = "per-ip2" },
		"host":            func(r *Rule) { r.Match.Hosts[0] = "api2.example.com" },
		"host removed":    func(r *Rule) { r.Match.Hosts = r.Match.Hosts[:1] },
		"path prefix":     func(r *Rule) { r.Match.PathPrefix[0] = "/adm" },
		"method":          func(r *Rule) { r.Match.Methods = []string{"GET"} },
		"key":             func(r *Rule) { r.Key = []string{"ip"} },
		"key header name": func(r *Rule) { r.Key[1] = "header:X-Api-Token" },
		"key order":       func(r *Rule) { r.Key[0], r.Key[1] = r.Key[1], r.Key[0] },
		"algorithm":       func(r *Rule) { r.Algorithm = "sliding_window" },
		"limit":           func(r *Rule) { r.Limit = 101 },
		"window":          func(r *Rule) { r.Window = Duration(59 * time.Second) },
		"burst":           func(r *Rule) { r.Burst = 99 },
		"cost":            func(r *Rule) { r.Cost = 2 },
		"shadow":          func(r *Rule) { r.Shadow = true },
		"scope":           func(r *Rule) { r.Scope = ScopePoP },
		"disabled":        func(r *Rule) { r.Disabled = true },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			d := base.clone()
			change(&d.Rules[0])
			require.NotEqual(t, baseVersion, Version(d))
		})
	}
	t.Run("min_interval", func(t *testing.T) {
		d := base.clone()
		d.Rules[1].MinInterval = Duration(time.Second)
		require.NotEqual(t, baseVersion, Version(d))
	})
	t.Run("rule removed", func(t *testing.T) {
		d := base.clone()
		d.Rules = d.Rules[:1]
		require.NotEqual(t, baseVersion, Version(d))
	})
	t.Run("non-UTF-8 prefixes stay distinct", func(t *testing.T) {
		a, b := base.clone(), base.clone()
		a.Rules[0].Match.PathPrefix[0] = "/%FF"
		b.Rules[0].Match.PathPrefix[0] = "/%FE"
		require.NotEqual(t, Version(a), Version(b))
	})
}

func TestVersionDoesNotModifyInput(t *testing.T) {
	r := validRule("r")
	r.Match.Methods = []string{"post", "get"}
	doc := &Document{Version: 1, Rules: []Rule{r}}
	_ = Version(doc)
	require.Equal(t, []string{"post", "get"}, doc.Rules[0].Match.Methods)
}

func TestSnapshotVersionMatchesVersion(t *testing.T) {
	doc := mustParse(t, versionBase)
	merged, err := Merge(doc, nil)
	require.NoError(t, err)
	s := mustCompile(t, doc)
	require.Equal(t, Version(doc), s.Version())
	require.Equal(t, Version(merged), s.Version(), "CLI (Version of Merge) and edge (Snapshot) agree")
	require.Equal(t, Version(nil), Version(&Document{Version: 1}))
	var nilSnap *Snapshot
	require.Equal(t, Version(nil), nilSnap.Version())
}

func TestDocumentVersionIdentifiesTheDocument(t *testing.T) {
	offPerIP := "version: 1\nrules:\n  - {id: per-ip, disabled: true}\n"
	offBurst := "version: 1\nrules:\n  - {id: burst, disabled: true}\n"
	offBoth := "version: 1\nrules:\n  - {id: per-ip, disabled: true}\n  - {id: burst, disabled: true}\n"
	empty := "version: 1\n"
	emptyRules := "version: 1\nrules: []\n"

	// What they do on their own is the same: nothing.
	for _, src := range []string{offPerIP, offBurst, offBoth, emptyRules} {
		require.Equal(t, Version(mustParse(t, empty)), Version(mustParse(t, src)), src)
	}

	distinct := map[string]string{
		"per-ip off":           offPerIP,
		"burst off":            offBurst,
		"both off":             offBoth,
		"empty":                empty,
		"active rules":         versionBase,
		"active plus disabled": versionBase + "  - {id: gone, disabled: true}\n",
		"active rule off":      strings.Replace(versionBase, "  - id: other\n", "  - id: other\n    disabled: true\n", 1),
	}
	seen := map[string]string{}
	for name, src := range distinct {
		v := DocumentVersion(mustParse(t, src))
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{12}$`), v)
		if other, dup := seen[v]; dup {
			t.Fatalf("%q and %q share document version %s", name, other, v)
		}
		seen[v] = name
	}

	same := map[string][2]string{
		"empty, written two ways": {empty, emptyRules},
		"disabled rules reordered": {offBoth,
			"# reordered, other style\nrules:\n- disabled: true\n  id: burst\n- id: per-ip\n  disabled: true\nversion: 1\n"},
		"active and disabled rules reordered": {versionBase + "  - {id: gone, disabled: true}\n",
			"version: 1\nrules:\n  - {id: gone, disabled: true}\n" + strings.TrimPrefix(versionBase, "\nversion: 1\nrules:\n")},
	}
	for name, pair := range same {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, DocumentVersion(mustParse(t, pair[0])), DocumentVersion(mustParse(t, pair[1])))
		})
	}

	t.Run("equals Version without disabled rules", func(t *testing.T) {
		doc := mustParse(t, versionBase)
		require.Equal(t, Version(doc), DocumentVersion(doc))
		merged, err := Merge(doc, mustParse(t, offPerIP))
		require.NoError(t, err)
		require.Equal(t, Version(merged), DocumentVersion(merged), "a merged rule set has no disabled rules")
	})
	t.Run("nil is the empty document", func(t *testing.T) {
		require.Equal(t, DocumentVersion(mustParse(t, empty)), DocumentVersion(nil))
	})
}

// ParseVersion's version is DocumentVersion of what Parse returns, for
// documents Parse normalizes (spellings, order), with disabled rules, and
// read in pieces; its errors are Parse's.
func TestParseVersion(t *testing.T) {
	docs := map[string]string{
		"base": versionBase,
		"other spellings": "rules:\n- {id: per-ip, key: [ip, header:x-api-key], algorithm: token_bucket, limit: 100, burst: 100, window: 60s, " +
			"match: {methods: [post, get], path_prefix: [/admin/, //api], hosts: [\"*.EXAMPLE.com\", API.example.com.]}}\n" +
			"- {id: other, key: [host], algorithm: sliding_log, limit: 5, window: 10000ms}\nversion: 1\n",
		"disabled rules": versionBase + "  - {id: gone, disabled: true}\n",
		"empty":          "version: 1\n",
		"in pieces":      bigRules("version: 1\nrules:\n", "  - {id: off, disabled: true}\n", 600, blockItem),
	}
	defer func(was int) { pieceSize = was }(pieceSize)
	pieceSize = len(docs["in pieces"]) / 8
	for name, src := range docs {
		t.Run(name, func(t *testing.T) {
			forgetPieces()
			doc, v, err := ParseVersion([]byte(src))
			require.NoError(t, err)
			want := mustParse(t, src)
			require.Equal(t, want, doc)
			require.Equal(t, DocumentVersion(want), v)
			if strings.Contains(src, "disabled: true") {
				require.NotEqual(t, Version(want), v, "a document version counts the disabled rules too")
			}
		})
	}
	_, _, err := ParseVersion([]byte("version: 1\nrules:\n  - {id: x, limit: -1}\n"))
	_, perr := Parse([]byte("version: 1\nrules:\n  - {id: x, limit: -1}\n"))
	require.Error(t, err)
	require.Equal(t, perr.Error(), err.Error())
}
