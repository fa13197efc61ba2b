package servers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The agent is found where the operator said, else in PATH, else in the
// cache scripts/install-consul.sh fills; a wrong EDGEGUARD_CONSUL is an
// error, and every error says how to get one.
func TestConsulLookup(t *testing.T) {
	// t.Setenv rules out t.Parallel.
	fake := func(dir string) string {
		path := filepath.Join(dir, "consul")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755))
		return path
	}
	cache := t.TempDir()
	t.Setenv("EDGEGUARD_CACHE", cache)
	t.Setenv("PATH", t.TempDir())

	t.Setenv("EDGEGUARD_CONSUL", "")
	_, err := Consul()
	require.Error(t, err)
	require.Contains(t, err.Error(), "make tools")
	require.Contains(t, err.Error(), filepath.Join(cache, "consul-"+ConsulVersion, "consul"))

	cached := fake(filepath.Join(cache, "consul-"+ConsulVersion))
	got, err := Consul()
	require.NoError(t, err)
	require.Equal(t, cached, got, "the cache is the last resort")

	inPath := t.TempDir()
	t.Setenv("PATH", inPath)
	onPath := fake(inPath)
	got, err = Consul()
	require.NoError(t, err)
	require.Equal(t, onPath, got, "PATH comes before the cache")

	explicit := fake(t.TempDir())
	t.Setenv("EDGEGUARD_CONSUL", explicit)
	got, err = Consul()
	require.NoError(t, err)
	require.Equal(t, explicit, got, "EDGEGUARD_CONSUL comes first")

	t.Setenv("EDGEGUARD_CONSUL", filepath.Join(t.TempDir(), "missing"))
	_, err = Consul()
	require.Error(t, err, "a wrong EDGEGUARD_CONSUL is an error, not a reason to look elsewhere")
	require.Contains(t, err.Error(), "make tools")
}

// No program edgeguard ships or operates with links the test harness or
// package testing: the stack's tooling finds servers here, not there.
func TestCommandsDoNotLinkTheTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/edgeguard/edgeguard/cmd/...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/edgeguard/edgeguard/internal/servers")
	require.NotContains(t, deps, "github.com/edgeguard/edgeguard/internal/testenv")
	require.NotContains(t, deps, "testing")
}
