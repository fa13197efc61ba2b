// Command stackctl starts, health-checks, reconciles and stops the local
// multi-region stack's processes for Terraform (terraform/environments/local);
// see package stack.
package main

import (
	"os"

	"github.com/edgeguard/edgeguard/internal/stack"
)

func main() {
	os.Exit(stack.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
