package peerbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// tenantLoadEnv, when set in the environment, makes ServeOriginIfAsked
// drive the loadSpec it holds (JSON) and print a loadReport instead of
// serving: a.example's clients run in a process of their own, so their
// goroutines do not queue b.example's in one Go scheduler (clients on other
// machines would not).
const tenantLoadEnv = "PEERBENCH_TENANT_LOAD"

// loadSpec is the load one child process drives until Until.
type loadSpec struct {
	Addr, Host, Priority string
	Sources              []string
	Conns                int
	Timeout              time.Duration
	Until                time.Time
}

// loadReport is what its clients got, as count holds it.
type loadReport struct {
	Sent, OK, Refused, Other, Errs int
	FirstErr, Refusal, Oddity      string
}

// runTenantLoad drives the spec in env and prints its report; it exits.
func runTenantLoad(env string) {
	var spec loadSpec
	if err := json.Unmarshal([]byte(env), &spec); err != nil || spec.Conns < 1 || len(spec.Sources) == 0 {
		fmt.Fprintf(os.Stderr, "tenant load: bad spec %q: %v\n", env, err)
		os.Exit(2)
	}
	ctx, cancel := context.WithDeadline(context.Background(), spec.Until)
	defer cancel()
	var c count
	var wg sync.WaitGroup
	drive(ctx, &wg, spec.Addr, spec.Sources, spec.Host, spec.Priority, spec.Conns, spec.Timeout, func(time.Time) *count { return &c })
	wg.Wait()
	r := loadReport{Sent: c.sent, OK: c.ok, Refused: c.refused, Other: c.other, Errs: c.errs, Refusal: c.refusal, Oddity: c.oddity}
	if c.firstErr != nil {
		r.FirstErr = c.firstErr.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

// childLoad is a load driven by a child process of this program.
type childLoad struct {
	cmd      *exec.Cmd
	out, log bytes.Buffer
}

// startLoad starts a child process driving spec.
func startLoad(spec loadSpec) (*childLoad, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	l := &childLoad{cmd: exec.Command(exe)}
	l.cmd.Env = append(os.Environ(), tenantLoadEnv+"="+string(b))
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.log
	if err := l.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the load for %s: %w", spec.Host, err)
	}
	return l, nil
}

// wait waits for the child (it ends by itself once its clients' last
// requests are answered) and adds its report to c.
func (l *childLoad) wait(c *count) error {
	if err := l.cmd.Wait(); err != nil {
		return fmt.Errorf("the load process: %w: %s", err, l.log.String())
	}
	var r loadReport
	if err := json.Unmarshal(l.out.Bytes(), &r); err != nil {
		return fmt.Errorf("the load process's report %q: %w", l.out.String(), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent, c.ok, c.refused, c.other, c.errs = c.sent+r.Sent, c.ok+r.OK, c.refused+r.Refused, c.other+r.Other, c.errs+r.Errs
	if c.firstErr == nil && r.FirstErr != "" {
		c.firstErr = fmt.Errorf("%s", r.FirstErr)
	}
	if c.refusal == "" {
		c.refusal = r.Refusal
	}
	if c.oddity == "" {
		c.oddity = r.Oddity
	}
	return nil
}
