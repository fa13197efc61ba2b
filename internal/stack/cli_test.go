package stack

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// Terraform's destroy-time provisioner hands stackctl down the component's
// spec, as up got it: stackctl names the component from it, stops its
// processes and removes its directory.
func TestDownBySpec(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	st := State{Dir: t.TempDir()}
	spec := Spec{Kind: KindOrigin, Bin: "/b", Origin: &OriginSpec{Region: "r1", Port: 1, Workers: 1, ServiceTime: "1ms"}}
	require.NoError(t, st.save(spec))
	dir := st.componentDir(OriginID("r1"))
	d := proc.Daemon{Name: "origin", Dir: dir, Bin: sleep, Args: []string{"60"}}
	pid, err := d.Start()
	require.NoError(t, err)
	t.Cleanup(func() { d.Stop(time.Second) })

	raw, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	require.NoError(t, err)
	env := map[string]string{"STACK_SPEC": string(raw)}
	var stdout, stderr bytes.Buffer
	code := Main([]string{"--state", st.Dir, "down"}, func(k string) string { return env[k] }, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.True(t, proc.Gone(pid), "the component's process is stopped")
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "its directory is removed")

	// Without a spec or an id, down is a usage error.
	code = Main([]string{"--state", st.Dir, "down"}, func(string) string { return "" }, &stdout, &stderr)
	require.Equal(t, 2, code)
}
