package stack

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

const usage = `Usage: stackctl [--state DIR] COMMAND

Runs the local stack's processes for Terraform's provisioners (see
terraform/README.md). The state dir (--state, else $STACK_STATE) keeps each
component's spec, pids, configs and logs.

  up                 bring up the component described by $STACK_SPEC (JSON), or back up
  reconcile --rules FILE [--rls FILE|DIR]
                     restart whatever died, push FILE (and the rate limit service's documents) to
                     every region, wait until every edge is ready
  down               stop the component described by $STACK_SPEC and remove its files
  down ID            stop component ID and remove its files
  down --all         stop every component in the state dir
  endpoints [--outputs FILE]
                     print the endpoints from outputs.json
  status             each component's running and dead processes (JSON)
`

// Main runs stackctl and returns its exit code.
func Main(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stackctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	state := fs.String("state", getenv("STACK_STATE"), "state directory")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *state == "" || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	abs, err := filepath.Abs(*state)
	if err != nil {
		fmt.Fprintln(stderr, "stackctl:", err)
		return 1
	}
	st := State{Dir: abs}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err = run(ctx, st, fs.Args(), getenv, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "stackctl:", err)
		fs.Usage()
		return 2
	default:
		fmt.Fprintln(stderr, "stackctl:", err)
		return 1
	}
}

type usageError string

func (e usageError) Error() string { return string(e) }

func run(ctx context.Context, st State, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "up":
		if len(rest) != 0 {
			return usageError("up takes no arguments (the spec is $STACK_SPEC)")
		}
		raw := getenv("STACK_SPEC")
		if raw == "" {
			return usageError("up: $STACK_SPEC is empty")
		}
		s, err := ParseSpec([]byte(raw))
		if err != nil {
			return err
		}
		start := time.Now()
		if err := st.Up(ctx, s); err != nil {
			return fmt.Errorf("bringing up %s: %w", s.ID(), err)
		}
		fmt.Fprintf(stdout, "stackctl: %s up (%s)\n", s.ID(), time.Since(start).Round(time.Millisecond))
		return nil
	case "reconcile":
		fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
		fs.SetOutput(stderr)
		rules := fs.String("rules", "", "rules document pushed to every region")
		rls := fs.String("rls", "", "rate limit service documents (a file or a directory of them) pushed to every region")
		if err := fs.Parse(rest); err != nil || fs.NArg() != 0 {
			return usageError("reconcile: [--rules FILE] [--rls FILE|DIR]")
		}
		for what, path := range map[string]string{"rules file": *rules, "rate limit service documents": *rls} {
			if path == "" {
				continue
			}
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		start := time.Now()
		if err := st.Reconcile(ctx, ReconcileOptions{RulesFile: *rules, RLSPath: *rls, Log: stdout}); err != nil {
			return fmt.Errorf("reconciling: %w", err)
		}
		fmt.Fprintf(stdout, "stackctl: reconciled in %s\n", time.Since(start).Round(time.Millisecond))
		return nil
	case "down":
		switch {
		case len(rest) == 1 && rest[0] == "--all":
			return st.DownAll()
		case len(rest) == 1:
			return st.Down(rest[0])
		case len(rest) == 0 && getenv("STACK_SPEC") != "":
			// Terraform's destroy-time provisioner: the component is named
			// from its spec, as up named it.
			s, err := ParseSpec([]byte(getenv("STACK_SPEC")))
			if err != nil {
				return err
			}
			return st.Down(s.ID())
		}
		return usageError("down: ID, --all or $STACK_SPEC")
	case "endpoints":
		fs := flag.NewFlagSet("endpoints", flag.ContinueOnError)
		fs.SetOutput(stderr)
		path := fs.String("outputs", filepath.Join(st.Dir, "outputs.json"), "outputs.json")
		if err := fs.Parse(rest); err != nil || fs.NArg() != 0 {
			return usageError("endpoints: [--outputs FILE]")
		}
		o, err := ReadOutputs(*path)
		if err != nil {
			return err
		}
		return PrintEndpoints(stdout, o)
	case "status":
		cs, err := st.Status()
		if err != nil {
			return err
		}
		data, err := MarshalStatus(cs)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(data))
		return nil
	}
	return usageError(fmt.Sprintf("unknown command %q", cmd))
}
