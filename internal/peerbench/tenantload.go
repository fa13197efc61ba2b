package peerbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

// loadSpec is the load one child process drives, from when its parent
// says go (a line on its standard input: loadGo) until the time that line
// gives. The child is started ahead of its phase and says when it is ready
// (a first line on its standard output, readyLine), so the phase does not
// wait on a process starting: a race-built test binary on a loaded host
// took longer than a whole 1 s phase to start, and a.example sent nothing.
type loadSpec struct {
	Addr, Host, Priority string
	Sources              []string
	Conns                int
	Timeout              time.Duration
}

// readyLine is a child's first line: it waits for its go.
const readyLine = "ready\n"

// loadGo starts a child's load: it drives until Until.
type loadGo struct{ Until time.Time }

// loadReport is what its clients got, as count holds it.
type loadReport struct {
	Sent, OK, Refused, Other, Errs int
	FirstErr, Refusal, Oddity      string
}

// runTenantLoad waits for its go on standard input, drives the spec in env
// and prints its report; it exits.
func runTenantLoad(env string) {
	var spec loadSpec
	if err := json.Unmarshal([]byte(env), &spec); err != nil || spec.Conns < 1 || len(spec.Sources) == 0 {
		fmt.Fprintf(os.Stderr, "tenant load: bad spec %q: %v\n", env, err)
		os.Exit(2)
	}
	_, _ = os.Stdout.WriteString(readyLine)
	var g loadGo
	if err := json.NewDecoder(os.Stdin).Decode(&g); err != nil || g.Until.IsZero() {
		fmt.Fprintf(os.Stderr, "tenant load: no go on standard input: %v\n", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithDeadline(context.Background(), g.Until)
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
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	ready, done chan struct{} // closed on its ready line; at the end of its output
	out, log    bytes.Buffer  // its report (after the ready line); its standard error
}

// startLoad starts a child process that will drive spec once told to go.
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
	l.cmd.Stderr = &l.log
	if l.stdin, err = l.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := l.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := l.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the load for %s: %w", spec.Host, err)
	}
	l.ready, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		br := bufio.NewReader(stdout)
		if line, err := br.ReadString('\n'); err != nil || line != readyLine {
			l.out.WriteString(line)
			return
		}
		close(l.ready)
		_, _ = io.Copy(&l.out, br)
	}()
	return l, nil
}

// waitReady waits until the child is ready for its go.
func (l *childLoad) waitReady(ctx context.Context) error {
	select {
	case <-l.ready:
		return nil
	case <-l.done:
		_ = l.cmd.Wait()
		return fmt.Errorf("the load process ended before it was ready: %q %s", l.out.String(), l.log.String())
	case <-ctx.Done():
		return fmt.Errorf("waiting for the load process to be ready: %w", ctx.Err())
	}
}

// begin tells the child to drive its load until until.
func (l *childLoad) begin(until time.Time) error {
	err := json.NewEncoder(l.stdin).Encode(loadGo{Until: until})
	if cerr := l.stdin.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("starting the load process: %w", err)
	}
	return nil
}

// stop ends a child that has not reported (an aborted phase).
func (l *childLoad) stop() {
	_ = l.cmd.Process.Kill()
	_ = l.cmd.Wait()
}

// wait waits for the child (it ends by itself once its clients' last
// requests are answered) and adds its report to c.
func (l *childLoad) wait(c *count) error {
	<-l.done // its whole report, before Wait closes the pipe
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
