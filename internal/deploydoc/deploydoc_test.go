package deploydoc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/servers"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// marker is the comment above the recipe's code block in docs/deployment.md.
const marker = "<!-- deploydoc:try-it"

// recipe is the first ```sh block after the marker.
func recipe(doc string) (string, error) {
	i := strings.Index(doc, marker)
	if i < 0 {
		return "", fmt.Errorf("no %q in the document", marker)
	}
	rest := doc[i:]
	const open = "```sh\n"
	j := strings.Index(rest, open)
	if j < 0 {
		return "", errors.New("no ```sh block after the marker")
	}
	body := rest[j+len(open):]
	k := strings.Index(body, "```")
	if k < 0 {
		return "", errors.New("the recipe's block is not closed")
	}
	return body[:k], nil
}

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test")
		dir = parent
	}
}

// TestDeploymentRecipe runs the recipe in bash from a directory holding
// what it names (bin/edge, bin/regionctl, examples/rules.yaml), on free
// ports passed in the variables it reads, with a consul on the PATH that
// is `consul agent -dev` on free ports too; it must end with the edge
// ready and the demo origin's answer through it. Every process the recipe
// starts is in the recipe's process group, which the test kills.
func TestDeploymentRecipe(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "deployment.md"))
	require.NoError(t, err)
	script, err := recipe(string(doc))
	require.NoError(t, err)
	consul, err := servers.Consul()
	require.NoError(t, err)
	_, err = servers.Lookup("redis-server")
	require.NoError(t, err)

	work := t.TempDir()
	buildCtx, buildCancel := context.WithTimeout(context.Background(), 10*time.Minute) // a cold build cache on a busy machine
	defer buildCancel()
	build := exec.CommandContext(buildCtx, "go", "build", "-o", filepath.Join(work, "bin")+string(filepath.Separator), "./cmd/edge", "./cmd/regionctl")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.Mkdir(filepath.Join(work, "examples"), 0o700))
	rules, err := os.ReadFile(filepath.Join(root, "examples", "rules.yaml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(work, "examples", "rules.yaml"), rules, 0o600))

	// The recipe's servers outlive bash: as their subreaper this process
	// inherits them, so it can wait for each to be gone.
	require.NoError(t, unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
	// A port picked free may be taken by another process before the
	// recipe's server binds it (the ports are closed when the recipe
	// starts): then that server exits saying so, and the recipe runs again
	// on ports picked again, as testenv does for the servers it starts.
	// Any other failure fails the test.
	var log []byte
	for attempt := 1; ; attempt++ {
		var runErr error
		log, runErr = runRecipe(t, work, script, consul)
		if attempt < bindAttempts && bytes.Contains(bytes.ToLower(log), []byte("address already in use")) {
			t.Logf("attempt %d: a port of the recipe was taken meanwhile; picking them again:\n%s", attempt, log)
			continue
		}
		require.NoError(t, runErr, "the recipe failed:\n%s", log)
		break
	}
	got := string(bytes.TrimSpace(log))
	require.Contains(t, got, "\nready", "the edge's /readyz, waited for:\n%s", log)
	last := got[strings.LastIndex(got, "HTTP/1.1 "):]
	require.True(t, strings.HasPrefix(last, "HTTP/1.1 200 OK"), "the recipe's last answer:\n%s", log)
}

// bindAttempts bounds the recipe's runs when a port it was given was taken
// before its server bound it.
const bindAttempts = 4

// runRecipe runs the recipe in work once, on free ports, and returns its
// output once every process it started is gone (killed: the recipe leaves
// its servers running).
func runRecipe(t *testing.T, work, script, consul string) ([]byte, error) {
	ports, err := testenv.FreePorts(7)
	require.NoError(t, err)
	redisPort, consulHTTP, serfLAN, serfWAN, server, edgePort, adminPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]
	// The consul the recipe finds first on the PATH: the real agent with
	// the recipe's arguments, its ports moved to free ones (and those it
	// does not need turned off).
	pathDir := filepath.Join(work, "path")
	require.NoError(t, os.MkdirAll(pathDir, 0o700))
	conf := filepath.Join(work, "consul.hcl")
	require.NoError(t, os.WriteFile(conf, fmt.Appendf(nil, `node_name = "deploydoc-%d"
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
advertise_addr = "127.0.0.1"
disable_update_check = true
disable_host_node_id = true
ports {
  http = %d
  https = -1
  dns = -1
  grpc = -1
  grpc_tls = -1
  serf_lan = %d
  serf_wan = %d
  server = %d
}
`, consulHTTP, consulHTTP, serfLAN, serfWAN, server), 0o600))
	wrapper := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\" -config-file=%s\n", servers.Quote(consul), servers.Quote(conf))
	require.NoError(t, os.WriteFile(filepath.Join(pathDir, "consul"), []byte(wrapper), 0o700))

	// Output to a file: the recipe leaves its servers running, and they
	// hold its stdout; Wait returns when bash does.
	logPath := filepath.Join(work, "recipe.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = work
	// A reader's shell: none of the test run's EDGEGUARD_ variables (the
	// edge would read them) or Consul's.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGEGUARD_") && !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env,
		"PATH="+pathDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		fmt.Sprintf("REDIS_PORT=%d", redisPort),
		fmt.Sprintf("CONSUL_HTTP_ADDR=127.0.0.1:%d", consulHTTP),
		fmt.Sprintf("EDGE=127.0.0.1:%d", edgePort),
		fmt.Sprintf("ADMIN=127.0.0.1:%d", adminPort),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	pgid := cmd.Process.Pid
	runErr := cmd.Wait()
	// Redis, Consul and the edge, all started by the recipe; SIGKILL
	// cannot be ignored, so the waits below end.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(-pgid, &ws, 0, nil); errors.Is(err, syscall.ECHILD) {
			break
		} else if err != nil && !errors.Is(err, syscall.EINTR) {
			t.Errorf("waiting for the recipe's processes: %v", err)
			break
		}
	}
	require.ErrorIs(t, syscall.Kill(-pgid, 0), syscall.ESRCH, "a process of the recipe is left")
	log, err := os.ReadFile(logPath)
	require.NoError(t, err)
	return log, runErr
}
