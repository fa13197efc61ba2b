package testenv

import (
	"fmt"
	"os"
	"os/exec"
)

// EdgePackage is the edge's main package, which BuildEdge builds.
const EdgePackage = "github.com/edgeguard/edgeguard/cmd/edge"

// BuildEdge builds this module's edge binary (cmd/edge) to out, for tests
// that run the edge as a process of its own.
func BuildEdge(out string) error {
	return GoBuild("", EdgePackage, out)
}

// GoBuild builds pkg in dir ("" the current directory) to out with the
// toolchain running the tests (`go test` puts its own first in PATH) and
// its module cache; env is added to the environment.
func GoBuild(dir, pkg, out string, env ...string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	cmd := exec.Command(goBin, "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		where := ""
		if dir != "" {
			where = " in " + dir
		}
		return fmt.Errorf("go build %s%s: %w\n%s", pkg, where, err, b)
	}
	return nil
}
