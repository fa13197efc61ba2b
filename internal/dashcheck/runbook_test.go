package dashcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const runbookBase = "https://github.com/edgeguard/edgeguard/blob/main/docs/runbook.md#"

// Every alert says how urgent it is and links its section of the runbook;
// every section of the runbook belongs to an alert and says what it means,
// how to confirm it and what to do; every alert has a promtool test that
// expects it to fire and one that expects it not to.
func TestAlertsHaveSeverityAndRunbook(t *testing.T) {
	root := filepath.Join("..", "..")
	rules, err := LoadRules(filepath.Join(root, "dashboards", "alerts", "edgeguard.rules.yml"))
	require.NoError(t, err)
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	require.NoError(t, err)
	tests, err := os.ReadFile(filepath.Join(root, "dashboards", "alerts", "edgeguard.test.yml"))
	require.NoError(t, err)

	sections := map[string]string{} // anchor → body
	parts := regexp.MustCompile(`(?m)^## `).Split(string(runbook), -1)
	for _, p := range parts[1:] {
		title, body, _ := strings.Cut(p, "\n")
		sections[strings.ToLower(strings.TrimSpace(title))] = body
	}

	alerts := map[string]bool{}
	for _, r := range rules {
		if !r.Alert {
			continue
		}
		alerts[r.Name] = true
		require.Contains(t, []string{"page", "ticket"}, r.Labels["severity"], "%s: severity", r.Name)
		url := r.Annotations["runbook_url"]
		require.True(t, strings.HasPrefix(url, runbookBase), "%s: runbook_url %q", r.Name, url)
		anchor := strings.TrimPrefix(url, runbookBase)
		require.Equal(t, strings.ToLower(r.Name), anchor, "%s: runbook_url names its own section", r.Name)
		body, ok := sections[anchor]
		require.True(t, ok, "%s: docs/runbook.md has no section %q", r.Name, r.Name)
		require.Contains(t, body, "Severity: "+r.Labels["severity"]+".", "%s: the runbook states its severity", r.Name)
		for _, part := range []string{"**What it means.**", "**How to confirm.**", "**What to do.**"} {
			require.Contains(t, body, part, "%s: runbook section", r.Name)
		}
		require.NotEmpty(t, r.Annotations["summary"], r.Name)
		require.NotEmpty(t, r.Annotations["description"], r.Name)

		// Firing: an exp_alerts list with an entry; quiet: an empty one.
		fires := regexp.MustCompile(`alertname: ` + r.Name + `\n\s+exp_alerts:\n\s+- exp_labels`)
		quiet := regexp.MustCompile(`alertname: ` + r.Name + `\n\s+exp_alerts: \[\]`)
		require.True(t, fires.Match(tests), "%s: no promtool test expects it to fire", r.Name)
		require.True(t, quiet.Match(tests), "%s: no promtool test expects it quiet", r.Name)
	}
	for anchor := range sections {
		found := false
		for a := range alerts {
			found = found || strings.ToLower(a) == anchor
		}
		require.True(t, found, "docs/runbook.md section %q has no alert", anchor)
	}
	for _, want := range []string{"EdgeguardEdgeDown", "EdgeguardEdgesAbsent", "EdgeguardMetricAbsent"} {
		require.True(t, alerts[want], want)
	}
}
