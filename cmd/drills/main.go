// Command drills runs the region drills against the applied local stack
// (make stack-up) and prints a table: drill, result, outcome counts, times.
// It exits 1 when a drill fails. See package drills.
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
	only := flag.String("only", "1,4,2,3", "drills to run, comma-separated, in this order (3 restarts a Consul server: last)")
	root := flag.String("root", ".", "repository root (rules_file is relative to it)")
	flag.Parse()
	env, err := drills.NewEnv(*outputs, *root, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drills:", err, "(is the stack up? make stack-up)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
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
