// Command rlsdiff compares `edge rls` with envoyproxy/ratelimit answer by
// answer, on the reference's own configuration files (package rlsdiff).
// It exits 0 when every difference is a documented one, 1 otherwise, 2 on
// trouble.
//
//	rlsdiff -reference path/to/ratelimit -reference-src path/to/checkout -edge bin/edge
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/edgeguard/edgeguard/internal/rlsdiff"
)

func main() {
	ref := flag.String("reference", "", "envoyproxy/ratelimit's binary (built from its checkout: go build ./src/service_cmd)")
	src := flag.String("reference-src", "", "a checkout of envoyproxy/ratelimit: its configuration files are served to both")
	edge := flag.String("edge", "bin/edge", "the edge binary, started as `edge rls`")
	redisServer := flag.String("redis-server", "redis-server", "the redis-server binary; each service gets its own")
	verbose := flag.Bool("v", false, "print documented differences too")
	flag.Parse()
	if *ref == "" || *src == "" {
		fmt.Fprintln(os.Stderr, "usage: rlsdiff -reference PATH -reference-src DIR [-edge PATH]")
		os.Exit(2)
	}
	sets, err := rlsdiff.Sets(*src)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsdiff:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := rlsdiff.Run(ctx, rlsdiff.Options{
		Reference:   rlsdiff.Command{Name: "reference", Path: *ref},
		Edge:        rlsdiff.Command{Name: "edge", Path: *edge, Args: []string{"rls"}, Env: []string{"EDGEGUARD_DRAIN_DELAY=0"}},
		Sets:        sets,
		RedisServer: *redisServer,
		Out:         os.Stdout,
		Verbose:     *verbose,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsdiff:", err)
		os.Exit(2)
	}
	if sum.Undocumented > 0 {
		os.Exit(1)
	}
}
