package drills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/stack"
)

// regionctl's exit code for an unreachable Consul.
const exitUnreachable = 7

// Drill3 stops eu-west's Consul server: its edges keep enforcing the last
// rules, also across an edge restart; a push to every region reports
// eu-west unreachable (exit 7) and succeeds for the others; once Consul is
// back, eu-west converges and regions status exits 0.
func (e *Env) Drill3(ctx context.Context, down string) *Result {
	r := newResult("3 consul down (" + down + ")")
	r.Err = e.drill3(ctx, down, r)
	return r
}

func (e *Env) drill3(ctx context.Context, down string, res *Result) (err error) {
	region, err := e.region(down)
	if err != nil {
		return err
	}
	var other string
	for _, name := range sortedNames(e.Out.Regions) {
		if name != down {
			other = name
			break
		}
	}
	if other == "" {
		return errors.New("drill 3 needs two regions")
	}
	otherConsul := e.Out.Regions[other].Consul.HTTP
	edges := region.Edges()
	consulID := stack.ConsulID(down)

	// Event: the region's Consul server dies.
	pid, err := e.signalProc(consulID, "consul", syscall.SIGKILL)
	if err != nil {
		return err
	}
	downAt := time.Now()
	restored := false
	defer func() {
		if !restored {
			_ = e.upComponent(context.WithoutCancel(ctx), consulID)
		}
	}()
	// Witness: the process is gone and its HTTP API refuses connections.
	if _, err := waitFor(ctx, 10*time.Second, "consul "+down+" to be down", func(ctx context.Context) error {
		if !gone(pid) {
			return errors.New("still running")
		}
		if code := status(ctx, region.Consul.HTTP+"/v1/status/leader"); code != 0 {
			return fmt.Errorf("still answers %d", code)
		}
		return nil
	}); err != nil {
		return err
	}

	// Outcome 1: every edge of the region still enforces the rules.
	for _, ed := range edges {
		if err := enforces(ctx, ed.URL); err != nil {
			return fmt.Errorf("edge %s with consul down: %w", ed.Name, err)
		}
	}
	res.Counts["edges_enforcing"] = len(edges)

	// Outcome 2: a restarted edge enforces too (from its rules cache).
	restart := edges[0]
	if err := e.restartEdge(ctx, restart); err != nil {
		return err
	}
	if err := enforces(ctx, restart.URL); err != nil {
		return fmt.Errorf("edge %s restarted with consul down: %w", restart.Name, err)
	}
	res.Counts["restarted_edge_enforcing"] = 1

	// Outcome 3: push --all reports the region unreachable, exit 7, and
	// succeeds elsewhere. A changed document, so "succeeds" means written.
	variant, err := e.rulesVariant(fmt.Sprintf("drill3-%d", rand.Uint32()))
	if err != nil {
		return err
	}
	defer os.Remove(variant)
	t0 := time.Now()
	out, code, err := e.regionctl(ctx, otherConsul, "--output", "json", "--timeout", "5s", "rules", "push", "--all", variant)
	if err != nil {
		return err
	}
	res.Times["push_all"] = time.Since(t0)
	// The remaining outcomes are checked even when this one fails, so one
	// run shows all of them.
	var pushErrs []error
	results, perr := parsePush(out)
	if perr != nil {
		return fmt.Errorf("push --all output: %w\n%s", perr, out)
	}
	if code != exitUnreachable {
		pushErrs = append(pushErrs, fmt.Errorf("push --all exited %d, want %d (unreachable)", code, exitUnreachable))
	}
	if got := results[down]; got.ExitCode != exitUnreachable {
		pushErrs = append(pushErrs, fmt.Errorf("push --all reported %s as %q (exit %d: %s), want unreachable (exit 7)", down, got.Status, got.ExitCode, got.Error))
	}
	for name, pr := range results {
		if name != down && pr.ExitCode != 0 {
			pushErrs = append(pushErrs, fmt.Errorf("push --all failed for %s: %s %s", name, pr.Status, pr.Error))
		}
	}
	if len(results) != len(e.Out.Regions) {
		pushErrs = append(pushErrs, fmt.Errorf("push --all reported %d regions, want %d", len(results), len(e.Out.Regions)))
	}
	for name, pr := range results {
		res.Counts["push_exit_"+name] = pr.ExitCode
	}
	res.Counts["push_exit"] = code
	defer func() {
		if len(pushErrs) > 0 {
			err = errors.Join(append(pushErrs, err)...)
		}
	}()

	// Outcome 4: Consul returns; after pushing again, the region converges
	// and regions status exits 0.
	if err := e.upComponent(ctx, consulID); err != nil {
		return err
	}
	restored = true
	res.Times["consul_down"] = time.Since(downAt)
	t0 = time.Now()
	if _, err := waitFor(ctx, 60*time.Second, "push to every region after consul returned", func(ctx context.Context) error {
		out, code, err := e.regionctl(ctx, otherConsul, "--timeout", "5s", "rules", "push", "--all", variant)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out))
		}
		return nil
	}); err != nil {
		return err
	}
	if _, err := waitFor(ctx, 60*time.Second, "regions status to exit 0", func(ctx context.Context) error {
		out, code, err := e.regionctl(ctx, otherConsul, "regions", "status")
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out))
		}
		return nil
	}); err != nil {
		return err
	}
	res.Times["converged_after_return"] = time.Since(t0)
	// Leave the stack on its own rules again.
	t0 = time.Now()
	if err := e.reconcile(ctx); err != nil {
		return fmt.Errorf("restoring the stack: %w", err)
	}
	res.Times["restore"] = time.Since(t0)
	return nil
}

// enforces sends drillLimit+5 requests from one fresh client to url's
// drill path and requires exactly drillLimit admitted and the rest denied
// with 429: the drill-exact rule is in force.
func enforces(ctx context.Context, base string) error {
	ip := fmt.Sprintf("10.%d.%d.%d", rand.IntN(250)+1, rand.IntN(250)+1, rand.IntN(250)+1)
	codes := map[int]int{}
	for range drillLimit + 5 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+drillPath, nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Forwarded-For", ip)
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusOK] != drillLimit || codes[http.StatusTooManyRequests] != 5 {
		return fmt.Errorf("got %v for %d requests, want %d × 200 and 5 × 429", codes, drillLimit+5, drillLimit)
	}
	return nil
}

// restartEdge stops an edge (SIGTERM, drain) and brings it back with its
// saved spec, as stackctl would.
func (e *Env) restartEdge(ctx context.Context, ed stack.Edge) error {
	id := stack.EdgeID(ed.Name)
	pid, err := e.signalProc(id, "edge", syscall.SIGTERM)
	if err != nil {
		return err
	}
	if _, err := waitFor(ctx, 20*time.Second, "edge "+ed.Name+" to exit", func(context.Context) error {
		if !gone(pid) {
			return errors.New("still running")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := e.upComponent(ctx, id); err != nil {
		return err
	}
	_, err = waitFor(ctx, 20*time.Second, "edge "+ed.Name+" to be ready", func(ctx context.Context) error {
		if code := status(ctx, ed.Admin+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d", code)
		}
		return nil
	})
	return err
}

// rulesVariant writes the stack's rules plus one shadow rule named id, so
// the document (and its version) differs.
func (e *Env) rulesVariant(id string) (string, error) {
	data, err := os.ReadFile(e.RulesFile())
	if err != nil {
		return "", err
	}
	extra := fmt.Sprintf("\n  - id: %s\n    match:\n      path_prefix: [\"/drill-marker\"]\n    key: [ip]\n    algorithm: fixed_window\n    limit: 1000\n    window: 1m\n    shadow: true\n", id)
	f, err := os.CreateTemp(e.Out.StateDir, "rules-variant-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Write(append(data, extra...)); err != nil {
		return "", err
	}
	return filepath.Clean(f.Name()), nil
}

type pushResult struct {
	Region   string `json:"region"`
	Status   string `json:"status"`
	Version  string `json:"version"`
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// parsePush reads regionctl's JSON output of a push: one object per
// region, as a list or in a "results" field.
func parsePush(out string) (map[string]pushResult, error) {
	start := strings.IndexAny(out, "[{")
	if start < 0 {
		return nil, errors.New("no JSON")
	}
	dec := json.NewDecoder(strings.NewReader(out[start:]))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	var list []pushResult
	if err := json.Unmarshal(raw, &list); err != nil {
		var wrapped struct {
			Results []pushResult `json:"results"`
		}
		if err := json.Unmarshal(raw, &wrapped); err != nil {
			return nil, err
		}
		list = wrapped.Results
	}
	m := map[string]pushResult{}
	for _, r := range list {
		m[r.Region] = r
	}
	return m, nil
}
