// Command edge is the edgeguard edge node: it sheds load, rate limits against
// its region's Redis and proxies allowed traffic to the origin. Every flag is
// also an EDGEGUARD_<NAME> environment variable; see `edge --help`.
//
// `edge rls`, or the binary installed under envoyproxy/ratelimit's name
// (ratelimit), serves Envoy's rate limit service alone, configured by that
// service's own environment variables (package rlsd).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge"
	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/rlsd"
)

func main() {
	if slices.Contains(os.Args[1:], "--version") || slices.Contains(os.Args[1:], "-version") {
		fmt.Println("edge", buildinfo.Get())
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(check.Run(os.Args[2:], os.Environ(), os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "rls" {
		// The rate limit service alone, configured by envoyproxy/ratelimit's
		// environment variables (docs/envoy.md, "Service-only mode").
		os.Exit(rlsd.Main(os.Args[2:], os.Environ(), os.Stderr))
	}
	if filepath.Base(os.Args[0]) == "ratelimit" {
		// Installed as envoyproxy/ratelimit's binary (its image's
		// /bin/ratelimit): the same service, started as that one is.
		os.Exit(rlsd.Main(os.Args[1:], os.Environ(), os.Stderr))
	}
	// First, so the variables naming inherited sockets are gone before the
	// environment is read as settings.
	inherited, ierr := handoff.Inherited()
	cfg, code, ok := config.ParseCommandLine(os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if !ok {
		os.Exit(code)
	}
	log := config.NewLogger(os.Stderr, cfg.LogLevel)
	if ierr != nil {
		log.Error("edge refused to start", "err", ierr)
		os.Exit(1)
	}
	e, err := edge.NewInherited(cfg, log, inherited)
	if err != nil {
		log.Error("edge refused to start", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := e.Run(ctx); err != nil {
		log.Error("edge failed", "err", err)
		os.Exit(1)
	}
}
