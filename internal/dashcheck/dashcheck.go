// Package dashcheck reads the Grafana boards and Prometheus rules under
// dashboards/ the way Grafana and Prometheus do (panel targets, template
// variables, annotation queries, rule expressions), so a test can evaluate
// every query against a Prometheus scraping real edges.
package dashcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Target is one query of a panel or annotation.
type Target struct {
	Expr    string `json:"expr"`
	Legend  string `json:"legendFormat"`
	Instant bool   `json:"instant"`
	RefID   string `json:"refId"`
}

// Panel is a board panel with queries (rows are skipped).
type Panel struct {
	Title       string   `json:"title"`
	Type        string   `json:"type"`
	Description string   `json:"description"`
	Targets     []Target `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit       string `json:"unit"`
			Thresholds *struct {
				Steps []struct {
					Value *float64 `json:"value"`
					Color string   `json:"color"`
				} `json:"steps"`
			} `json:"thresholds"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

// Annotation is a Prometheus annotation query.
type Annotation struct {
	Name            string  `json:"name"`
	Expr            string  `json:"expr"`
	UseValueForTime bool    `json:"useValueForTime"`
	Target          *Target `json:"target"`
}

// Variable is a dashboard template variable.
type Variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Definition string `json:"definition"`
}

// Board is one dashboard file.
type Board struct {
	File        string
	UID         string  `json:"uid"`
	Title       string  `json:"title"`
	Panels      []Panel `json:"panels"`
	Annotations struct {
		List []Annotation `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// LoadBoards reads every board in dir: each <uid>.json file.
func LoadBoards(dir string) ([]Board, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var boards []Board
	for _, f := range files {
		switch filepath.Base(f) {
		case "package.json", "package-lock.json", "tsconfig.json": // the generator's, not boards
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading board: %w", err)
		}
		var b Board
		if err := json.Unmarshal(data, &b); err != nil {
			return nil, fmt.Errorf("parsing board %s: %w", f, err)
		}
		b.File = filepath.Base(f)
		if b.UID == "" || b.UID+".json" != b.File {
			return nil, fmt.Errorf("board %s: its uid %q must name the file", b.File, b.UID)
		}
		b.Panels = slices.DeleteFunc(b.Panels, func(p Panel) bool { return p.Type == "row" })
		boards = append(boards, b)
	}
	if len(boards) == 0 {
		return nil, fmt.Errorf("no boards in %s", dir)
	}
	return boards, nil
}

// Rule is a recording or alerting rule.
type Rule struct {
	Name  string // record or alert name
	Alert bool
	Expr  string
	// Labels and Annotations are an alert's.
	Labels, Annotations map[string]string
}

// LoadRules reads a Prometheus rule file.
func LoadRules(path string) ([]Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading rules: %w", err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Record      string            `yaml:"record"`
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing rules %s: %w", path, err)
	}
	var out []Rule
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			out = append(out, Rule{Name: r.Record + r.Alert, Alert: r.Alert != "", Expr: r.Expr, Labels: r.Labels, Annotations: r.Annotations})
		}
	}
	return out, nil
}

// Substitute replaces Grafana variables ($name, ${name}) in expr with vars;
// an unknown variable is an error, so a board cannot use a variable the
// check does not know how to fill.
func Substitute(expr string, vars map[string]string) (string, error) {
	var errs []error
	out := varRe.ReplaceAllStringFunc(expr, func(m string) string {
		name := strings.Trim(m, "${}")
		v, ok := vars[name]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown variable %s in %q", m, expr))
			return m
		}
		return v
	})
	return out, errors.Join(errs...)
}

var varRe = regexp.MustCompile(`\$\{\w+\}|\$\w+`)

// MultiValue renders a multi-value selection as Grafana's Prometheus data
// source does inside a regex matcher: (a|b), regex metacharacters escaped
// with a backslash that is itself escaped for the PromQL string.
func MultiValue(values []string) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
	}
	return "(" + strings.Join(quoted, "|") + ")"
}

// LegendLabels lists the labels a legend format names ({{label}}).
func LegendLabels(legend string) []string {
	var out []string
	for _, m := range legendRe.FindAllStringSubmatch(legend, -1) {
		out = append(out, m[1])
	}
	return out
}

var legendRe = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// MetricNames lists the edgeguard_ and redis_ metric names expr reads,
// without histogram suffixes, sorted and unique.
func MetricNames(expr string) []string {
	seen := map[string]bool{}
	for _, m := range metricRe.FindAllString(expr, -1) {
		if strings.HasPrefix(m, "edgeguard:") {
			continue
		}
		m = strings.TrimSuffix(m, "_bucket")
		seen[m] = true
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

var metricRe = regexp.MustCompile(`\b(?:edgeguard|redis)_[a-z_]+\b`)

// GroupBy lists the labels of expr's first "by (...)" clause, the outermost
// aggregation in the boards' and rules' style, without "le" (which
// histogram_quantile consumes): every series the expression returns must
// carry them.
func GroupBy(expr string) []string {
	m := byRe.FindStringSubmatch(expr)
	if m == nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(m[1], ",") {
		if l = strings.TrimSpace(l); l != "" && l != "le" {
			out = append(out, l)
		}
	}
	return out
}

var byRe = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
