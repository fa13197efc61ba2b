package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Up saves spec and brings its component up (or back up).
func (st State) Up(ctx context.Context, s Spec) error {
	if err := st.save(s); err != nil {
		return err
	}
	return st.ensure(ctx, s)
}

func (st State) ensure(ctx context.Context, s Spec) error {
	dir := st.componentDir(s.ID())
	switch s.Kind {
	case KindRedis:
		return ensureRedis(ctx, redisDeployment{spec: *s.Redis, dir: dir})
	case KindConsul:
		return ensureConsul(ctx, consulServer{spec: *s.Consul, dir: dir})
	case KindOrigin:
		return ensureOrigin(ctx, s, dir)
	case KindEdge:
		return ensureEdge(ctx, s, dir)
	case KindPrometheus:
		return ensurePrometheus(ctx, s, dir)
	}
	return fmt.Errorf("unknown kind %q", s.Kind)
}

// Down stops the component id and removes its directory. A component that
// is not there is a no-op.
func (st State) Down(id string) error {
	if id == "" || strings.ContainsAny(id, `/\`) || id == "." || id == ".." {
		return fmt.Errorf("invalid component id %q", id)
	}
	dir := st.componentDir(id)
	pids, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, pidFile := range pids {
		wg.Go(func() { proc.StopPidFile(dir, strings.TrimSuffix(filepath.Base(pidFile), ".pid"), 5*time.Second) })
	}
	wg.Wait()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// DownAll stops every component still recorded in the state dir (edges
// first, so they drain before Redis and Consul go).
func (st State) DownAll() error {
	specs, err := st.Specs()
	if err != nil {
		return err
	}
	slices.Reverse(specs)
	var errs []error
	for _, s := range specs {
		errs = append(errs, st.Down(s.ID()))
	}
	return errors.Join(errs...)
}

// ReconcileOptions say what reconcile pushes.
type ReconcileOptions struct {
	// RulesFile is pushed as the global document to every region.
	RulesFile string
	// RLSPath (a file or a directory) holds the rate limit service's
	// documents, pushed to every region, so the edges' rate limit service
	// answers (and passes its health check) from the start.
	RLSPath string
	// Log receives progress lines.
	Log io.Writer
}

// Reconcile brings every saved component back to running and healthy, in
// dependency order, pushes the rules and the region catalog (every region's
// Redis, from the edges' specs) and returns once every edge is ready,
// registered as passing and runs the pushed rules.
func (st State) Reconcile(ctx context.Context, opts ReconcileOptions) error {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	specs, err := st.Specs()
	if err != nil {
		return err
	}
	byKind := map[string][]Spec{}
	for _, s := range specs {
		byKind[s.Kind] = append(byKind[s.Kind], s)
	}
	// What is dead now is what this reconcile brings back: say so.
	if comps, err := st.Status(); err == nil {
		for _, c := range comps {
			if len(c.Dead) > 0 {
				fmt.Fprintf(logw, "stackctl: %s: restarting %s\n", c.ID, strings.Join(c.Dead, ", "))
			}
		}
	}
	step := func(kind string) error {
		start := time.Now()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for _, s := range byKind[kind] {
			wg.Go(func() {
				if err := st.ensure(ctx, s); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", s.ID(), err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		fmt.Fprintf(logw, "stackctl: %d %s component(s) running (%s)\n", len(byKind[kind]), kind, time.Since(start).Round(time.Millisecond))
		return errors.Join(errs...)
	}
	for _, kind := range []string{KindRedis, KindConsul, KindOrigin} {
		if err := step(kind); err != nil {
			return err
		}
	}
	var servers []consulServer
	for _, s := range byKind[KindConsul] {
		servers = append(servers, consulServer{spec: *s.Consul, dir: st.componentDir(s.ID())})
	}
	if err := waitWAN(ctx, servers); err != nil {
		return err
	}
	bin := "" // where the stack's binaries are (regionctl beside the edge)
	for _, s := range specs {
		bin = s.Bin
	}
	if opts.RulesFile != "" && len(servers) > 0 {
		out, err := regionctl(ctx, filepath.Join(bin, "regionctl"), servers[0].httpAddr(), "rules", "push", "--all", "--author", "stackctl", "--message", "stack reconcile", opts.RulesFile)
		if err != nil {
			return fmt.Errorf("pushing %s: %w\n%s", opts.RulesFile, err, out)
		}
		fmt.Fprintf(logw, "stackctl: rules pushed:\n%s", out)
	}
	if opts.RLSPath != "" && len(servers) > 0 {
		out, err := regionctl(ctx, filepath.Join(bin, "regionctl"), servers[0].httpAddr(), "rls", "push", "--all", "--yes", "--author", "stackctl", "--message", "stack reconcile", opts.RLSPath)
		if err != nil {
			return fmt.Errorf("pushing %s: %w\n%s", opts.RLSPath, err, out)
		}
		fmt.Fprintf(logw, "stackctl: rate limit service documents pushed:\n%s", out)
	}
	// The region catalog before the edges start (running edges watch it
	// and pick it up), so global rules have their homes from the start.
	var cat region.Catalog
	if len(byKind[KindEdge]) > 0 && len(servers) > 0 {
		if cat, err = st.pushCatalog(ctx, bin, servers[0].httpAddr(), byKind[KindEdge], logw); err != nil {
			return err
		}
	}
	if err := st.putTLS(ctx, specs, servers, logw); err != nil {
		return err
	}
	if err := step(KindEdge); err != nil {
		return err
	}
	if err := waitEdgesReady(ctx, byKind[KindEdge], servers); err != nil {
		return err
	}
	if err := waitEdgesCatalog(ctx, byKind[KindEdge], cat); err != nil {
		return err
	}
	if err := st.waitEdgesTLS(ctx, byKind[KindEdge]); err != nil {
		return err
	}
	fmt.Fprintf(logw, "stackctl: %d edge(s) ready, registered and converged\n", len(byKind[KindEdge]))
	return step(KindPrometheus)
}

// regionctl runs the regionctl binary against the agent at consul.
func regionctl(ctx context.Context, bin, consul string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--consul", consul}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// waitEdgesReady waits until every edge answers /readyz, every region's
// catalog lists its edges as passing and every edge reports the region's
// effective rules version (regionctl regions status exits 0).
func waitEdgesReady(ctx context.Context, edges []Spec, servers []consulServer) error {
	want := map[string][]string{} // region → edge addresses
	for _, s := range edges {
		want[s.Edge.Region] = append(want[s.Edge.Region], s.Edge.Addr)
		err := proc.Poll(ctx, "edge "+s.Edge.Name+" to be ready", func(ctx context.Context) error {
			return httpOK(ctx, s.Edge.AdminURL()+"/readyz")
		})
		if err != nil {
			return err
		}
	}
	for _, srv := range servers {
		cl, err := srv.client()
		if err != nil {
			return err
		}
		dc := srv.spec.Datacenter
		err = proc.Poll(ctx, "edges of "+dc+" to pass their checks and converge", func(ctx context.Context) error {
			entries, _, err := cl.Health().Service(srv.spec.Service, "", true, (&api.QueryOptions{}).WithContext(ctx))
			if err != nil {
				return err
			}
			var passing []string
			versions := map[string]bool{}
			for _, e := range entries {
				passing = append(passing, e.Service.Address)
				versions[e.Service.Meta["rules_version"]] = true
			}
			for _, a := range want[dc] {
				if !slices.Contains(passing, a) {
					return fmt.Errorf("edge %s is not passing in %s (passing: %v)", a, dc, passing)
				}
			}
			if len(versions) > 1 {
				return fmt.Errorf("edges of %s run different rules versions", dc)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Component is one entry of Status.
type Component struct {
	ID      string   `json:"id"`
	Kind    string   `json:"kind"`
	Running []string `json:"running"`
	Dead    []string `json:"dead"`
}

// Status lists every component and which of its processes run.
func (st State) Status() ([]Component, error) {
	specs, err := st.Specs()
	if err != nil {
		return nil, err
	}
	var out []Component
	for _, s := range specs {
		dir := st.componentDir(s.ID())
		c := Component{ID: s.ID(), Kind: s.Kind, Running: []string{}, Dead: []string{}}
		pids, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
		for _, f := range pids {
			name := strings.TrimSuffix(filepath.Base(f), ".pid")
			data, _ := os.ReadFile(f)
			pid, bin := proc.ParsePidFile(data)
			if pid > 0 && proc.RunningAs(pid, bin) != 0 {
				c.Running = append(c.Running, name)
			} else {
				c.Dead = append(c.Dead, name)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// MarshalStatus renders Status as JSON.
func MarshalStatus(cs []Component) ([]byte, error) { return json.MarshalIndent(cs, "", "  ") }
