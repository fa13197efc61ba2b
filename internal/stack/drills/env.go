// Package drills runs the region drills against an applied local stack
// (terraform/environments/local), reading its topology from the stack's
// outputs. Each drill creates its event, asserts a witness that the event
// happened, then asserts the outcome, and leaves the stack as it found it
// (restarting what it killed with stackctl, as a re-apply would).
//
//  1. A Redis master killed under steady load, in the Cluster and in the
//     Sentinel region.
//  2. Every edge of a region drained (the first, by name, that fails over):
//     DNS fails over to the next, whose capacity-limited origin makes its
//     edges shed the lower tiers.
//  3. A region's Consul down (the first region by name): edges keep
//     enforcing (also across a restart), regionctl reports the region
//     unreachable, and converges when it returns.
//  4. Rules pushed 5 times: every edge converges within 2 s each time.
//  5. The enforcement switch pushed 20 times per region: every edge of the
//     region runs it within 1 s of the push (p99).
//  6. The global rule (scope: global) over both regions: roaming clients
//     get one quota, L·(1+t) at most; the Sentinel region cut off from the
//     other decides from the static share, then heals and pays its debts.
package drills

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/promtext"
	"github.com/edgeguard/edgeguard/internal/stack"
)

// Env is an applied stack as the drills see it.
type Env struct {
	Out stack.Outputs
	// Root is the repository root (rules_file is relative to it).
	Root string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// NewEnv reads the stack's outputs.json.
func NewEnv(outputsPath, root string, log io.Writer) (*Env, error) {
	out, err := stack.ReadOutputs(outputsPath)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = io.Discard
	}
	return &Env{Out: out, Root: root, Log: log}, nil
}

func (e *Env) bin(name string) string { return filepath.Join(e.Out.StateDir, "bin", name) }

// RulesFile is the absolute path of the rules document the stack pushes.
func (e *Env) RulesFile() string { return filepath.Join(e.Root, e.Out.RulesFile) }

// region returns the named region or an error naming what exists.
func (e *Env) region(name string) (stack.Region, error) {
	r, ok := e.Out.Regions[name]
	if !ok {
		return r, fmt.Errorf("stack has no region %q", name)
	}
	return r, nil
}

// regionOfMode returns the first region (by name) whose Redis runs mode.
func (e *Env) regionOfMode(mode string) (string, stack.Region, error) {
	for _, name := range sortedNames(e.Out.Regions) {
		if r := e.Out.Regions[name]; r.Redis.Mode == mode {
			return name, r, nil
		}
	}
	return "", stack.Region{}, fmt.Errorf("stack has no %s region", mode)
}

// run runs a binary, returning combined output and exit code.
func run(ctx context.Context, env []string, bin string, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return out.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return out.String(), -1, fmt.Errorf("running %s: %w", bin, err)
	}
	return out.String(), 0, nil
}

// regionctl runs regionctl against the Consul agent at consulHTTP.
func (e *Env) regionctl(ctx context.Context, consulHTTP string, args ...string) (string, int, error) {
	return run(ctx, nil, e.bin("regionctl"), append([]string{"--consul", strings.TrimPrefix(consulHTTP, "http://")}, args...)...)
}

// reconcile re-applies the stack the way `make stack-up` does for dead
// processes: stackctl reconcile restarts them and waits for readiness.
func (e *Env) reconcile(ctx context.Context) error {
	out, code, err := run(ctx, nil, e.bin("stackctl"), "--state", e.Out.StateDir, "reconcile", "--rules", e.RulesFile())
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("stackctl reconcile exited %d:\n%s", code, out)
	}
	return nil
}

// upComponent brings one component back with its saved spec.
func (e *Env) upComponent(ctx context.Context, id string) error {
	spec, err := os.ReadFile(filepath.Join(e.Out.StateDir, id, "spec.json"))
	if err != nil {
		return err
	}
	out, code, err := run(ctx, []string{"STACK_SPEC=" + string(spec)}, e.bin("stackctl"), "--state", e.Out.StateDir, "up")
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("stackctl up %s exited %d:\n%s", id, code, out)
	}
	return nil
}

// signalProc signals the process recorded in STATE/<id>/<name>.pid and
// returns its pid.
func (e *Env) signalProc(id, name string, sig syscall.Signal) (int, error) {
	data, err := os.ReadFile(filepath.Join(e.Out.StateDir, id, name+".pid"))
	if err != nil {
		return 0, fmt.Errorf("reading pid of %s/%s: %w", id, name, err)
	}
	pid, _ := proc.ParsePidFile(data)
	if pid <= 0 {
		return 0, fmt.Errorf("pid of %s/%s: no pid in %q", id, name, data)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return 0, fmt.Errorf("signalling %s/%s (pid %d): %w", id, name, pid, err)
	}
	return pid, nil
}

// gone reports whether pid has exited (or is a zombie).
func gone(pid int) bool { return proc.Gone(pid) }

// metrics fetches and parses one /metrics page.
func metrics(ctx context.Context, url string) (promtext.Families, error) {
	return promtext.Scrape(ctx, httpClient, url)
}

// sumOverEdges sums the series of name matching match (label name,
// value, ...) over edges' admin /metrics.
func sumOverEdges(ctx context.Context, edges []stack.Edge, name string, match ...string) (float64, error) {
	total := 0.0
	for _, ed := range edges {
		fams, err := metrics(ctx, ed.Admin+"/metrics")
		if err != nil {
			return 0, err
		}
		total += promtext.Sum(fams, name, match...)
	}
	return total, nil
}

// rulesVersion is the rules version an edge exports
// (edgeguard_edge_rules_info{version}: /metrics is open, /debug needs the
// admin token).
func rulesVersion(ctx context.Context, admin string) (string, error) {
	fams, err := metrics(ctx, admin+"/metrics")
	if err != nil {
		return "", err
	}
	if f, ok := fams["edgeguard_edge_rules_info"]; ok {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "version" && m.GetGauge().GetValue() == 1 {
					return lp.GetValue(), nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s/metrics: no edgeguard_edge_rules_info", admin)
}

// status returns the HTTP status of GET url (0 when unreachable).
func status(ctx context.Context, url string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// waitFor polls cond every 50 ms until it holds or timeout passes, and
// returns how long it took.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) error) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := proc.PollEvery(ctx, 50*time.Millisecond, what, cond); err != nil {
		return time.Since(start), fmt.Errorf("not within %s: %w", timeout, err)
	}
	return time.Since(start), nil
}

func splitLines(s string) []string {
	var out []string
	for line := range strings.Lines(s) {
		out = append(out, strings.TrimSpace(line))
	}
	return out
}

func cut(s string, sep byte) (string, string, bool) {
	i := strings.IndexByte(s, sep)
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// jsonFrom decodes the first JSON value in out.
func jsonFrom(out string, v any) error {
	start := strings.IndexAny(out, "[{")
	if start < 0 {
		return errors.New("no JSON")
	}
	return json.NewDecoder(strings.NewReader(out[start:])).Decode(v)
}

func removeQuiet(path string) { _ = os.Remove(path) }
