package edge

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/rules/rulestest"
)

// aliasBombs are the documents whose anchors and merge keys expanded
// without bound: 4,000 rules merging one list of 4,000 path prefixes
// (122 KiB), and 15,000 of 15,000 (477 KiB, under Consul's value limit).
var aliasBombs = map[string][]byte{"122K": rulestest.AliasBomb122K(), "477K": rulestest.AliasBomb477K()}

// edge check refuses them as regionctl does, with the rule and the line
// where the reuse went past the budget; before, it called them valid (or
// ran out of memory).
func TestCheckRefusesAliasBomb(t *testing.T) {
	for name, doc := range aliasBombs {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "rules.yaml")
			require.NoError(t, os.WriteFile(f, doc, 0o600))
			var out bytes.Buffer
			require.Equal(t, 1, check.Run([]string{"--demo-origin", "--rules", f}, nil, &out, io.Discard), out.String())
			require.Regexp(t, `^`+regexp.QuoteMeta(f)+`:\d+: rule "r\d+": the document decodes to more than \d+ values .*each reuse of an anchor`, out.String())
		})
	}
}

// An edge given such a document as its --rules file does not start.
func TestRulesFileAliasBombRefused(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{testOrigin(t)}
	cfg.Rules = filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(cfg.Rules, aliasBombs["477K"], 0o600))
	_, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, "rules file "+cfg.Rules)
	require.ErrorContains(t, err, "each reuse of an anchor")
}

// An edge that finds the 477 KiB document in Consul refuses it: a running
// edge keeps its rules, and one (re)started with the document still in
// Consul serves the last good rules from its on-disk cache, ready, and
// says why at WARN. Before, both ran out of memory in the decoder.
func TestAliasBombInConsulServesCachedRules(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	push(t, rc, "eu-west", rc.Layout().GlobalRules(), tightGlobal)
	v1 := effectiveVersion(t, tightGlobal, "")
	consulEdge := func(cfg *config.Config) {
		cfg.Rules = ""
		cfg.Region, cfg.PoP = "eu-west", "ams"
		cfg.Consul, cfg.RulesCache = c.HTTPAddr(), cache
		cfg.AdminToken = testAdminToken
	}

	a, _ := startLoggedEdge(t, "", consulEdge)
	waitVersion(t, a, v1, time.Now())
	require.Equal(t, []int{200, 200, 429}, codes(t, a, 3, "/"))
	require.FileExists(t, cache)

	bomb := aliasBombs["477K"]
	_, err = rc.API().KV().Put(&api.KVPair{Key: rc.Layout().GlobalRules(), Value: bomb}, &api.WriteOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	// Refusing it means decoding it up to the budget: about a second
	// alone, tens of seconds under the race detector on a busy machine.
	// What is asserted is the refusal and the rules kept, not the time
	// (the budget's cost is pkg/rules's), so the wait is long.
	pushed := time.Now()
	require.Eventually(t, func() bool {
		return metricValue(t, a, "edgeguard_edge_rules_rejected_total") >= 1
	}, 3*time.Minute, 20*time.Millisecond, "the document is refused")
	t.Logf("refused %v after the push", time.Since(pushed).Round(time.Millisecond))
	require.Equal(t, v1, a.rules.Load().Version())
	require.Equal(t, []int{429}, codes(t, a, 1, "/"), "the rules in force stay")
	a.stop()
	require.NoError(t, a.stopErr)

	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	before := m.TotalAlloc
	b, logs := startLoggedEdge(t, "", consulEdge)
	runtime.ReadMemStats(&m)
	t.Logf("an edge's start with the %d-byte document in Consul allocated %d MB", len(bomb), (m.TotalAlloc-before)>>20)
	require.Equal(t, v1, b.rules.Load().Version(), "the cached rules")
	require.Equal(t, []int{200, 200, 429}, codes(t, b, 3, "/"), "limited as the cached rule says")
	resp, err := http.Get("http://" + b.AdminAddr() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.GreaterOrEqual(t, metricValue(t, b, "edgeguard_edge_rules_rejected_total"), 1.0)
	require.Regexp(t, `level=WARN msg="no valid rules from consul at start; enforcing the cached rules" err=".*each reuse of an anchor`, logs.String())
}

// rulesLimitsReference is what one document may hold and cost to read,
// from pkg/rules's constants: the one place regionctl, edge check and the
// edge take them from.
func rulesLimitsReference() string {
	n := func(v int) string { // 500000 as 500,000
		s := strconv.Itoa(v)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		return s
	}
	return "\n## Limits\n\n" +
		"Every reader of a rules document (`regionctl rules validate` and `push`, `edge check`, an edge's `--rules` file and its documents in Consul) " +
		"refuses a document past one of these (a reuse past the budget is named by its rule and line). An edge that finds one in Consul keeps the rules it runs, " +
		"or at start serves its cached rules (`--rules-cache`) and logs why at WARN.\n\n" +
		"| what | at most |\n|---|---|\n" +
		"| values decoded (every scalar, list and mapping, each reuse of an anchor through an alias or a `<<` merge key counted anew) | " + n(rules.DecodeValuesPerByte) + " per byte of the document, and " + n(rules.DecodeValuesBase) + " |\n" +
		"| rules (disabled ones included) | " + n(rules.MaxRules) + " |\n" +
		"| hosts (`match.hosts` and `bypass.hosts` of all rules) | " + n(rules.MaxHosts) + " |\n" +
		"| path prefixes (`match.path_prefix` and `bypass.path_prefix` of all rules) | " + n(rules.MaxPathPrefixes) + " |\n" +
		"| overrides (of all rules) | " + n(rules.MaxOverrides) + " |\n" +
		"| problems listed (the first in the text; one more line counts the rest) | " + n(rules.MaxProblems) + " |\n\n" +
		"Anchors, aliases and merge keys are allowed: text without them decodes to at most one value per two bytes, " +
		"so the budget leaves room for a rule of 40 bytes to merge a base of 100 values, " +
		"while a few bytes that stand for a list reused by thousands of rules are refused before they are expanded. " +
		"The limits are per document; an edge's rules merge its region's two (global and regional).\n"
}
