// Command regionctl validates, diffs, pushes and rolls back edgeguard rules
// and shedder settings in Consul KV, region by region, and shows which rules
// each region's edges run. See `regionctl --help` for the commands and exit
// codes.
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/regionctl"
)

func main() {
	if slices.Contains(os.Args[1:2], "--version") || slices.Contains(os.Args[1:2], "version") {
		fmt.Println("regionctl", buildinfo.Get())
		return
	}
	os.Exit(regionctl.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
