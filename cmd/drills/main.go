// Command drills runs the region drills against the applied local stack
// (make stack-up) and prints a table: drill, result, outcome counts, times.
// It exits 1 when a drill fails. See package drills.
//
// With an event instead, it runs only that drill's event, for a load test
// that brings its own traffic (loadtest/scenarios/failover.js), and prints
// it as one JSON line (what, when, when the stack showed it took effect):
//
//	drills [flags] kill-master [REGION]   SIGKILL a Redis master (default: the Sentinel region's) and wait for its replacement
//	drills [flags] drain REGION           SIGTERM every edge of REGION and wait until none reports ready
//	drills [flags] restore                bring back what was stopped (stackctl reconcile) and wait until ready
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/edgeguard/edgeguard/internal/stack/drills"
)

func main() {
	outputs := flag.String("outputs", ".stack/outputs.json", "the stack's outputs.json")
	only := flag.String("only", "1,4,5,6,2,3", "drills to run, comma-separated, in this order (3 restarts a Consul server: last)")
	root := flag.String("root", ".", "repository root (rules_file is relative to it)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: drills [flags] [kill-master [REGION] | drain REGION | restore]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	env, err := drills.NewEnv(*outputs, *root, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err, "(is the stack up? make stack-up)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if flag.NArg() > 0 {
		os.Exit(event(ctx, env, flag.Args()))
	}
	results, err := env.Run(ctx, strings.Split(*only, ","))
	if err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err)
		os.Exit(2)
	}
	_ = drills.PrintTable(os.Stdout, results)
	for _, r := range results {
		if r.Err != nil {
			os.Exit(1)
		}
	}
}

// event runs one drill event and returns the exit code.
func event(ctx context.Context, env *drills.Env, args []string) int {
	var (
		ev  drills.Event
		err error
	)
	switch {
	case args[0] == "kill-master" && len(args) <= 2:
		ev, err = env.KillMaster(ctx, strings.Join(args[1:], ""))
	case args[0] == "drain" && len(args) == 2:
		ev, err = env.DrainRegion(ctx, args[1])
	case args[0] == "restore" && len(args) == 1:
		ev, err = env.Restore(ctx)
	default:
		flag.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "drills: %s: %v\n", args[0], err)
		return 1
	}
	if err := ev.Print(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err)
		return 1
	}
	return 0
}
