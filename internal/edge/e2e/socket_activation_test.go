package e2e

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// activation is what systemd hands an edge it starts for a socket unit:
// listening sockets, the variables naming them, a notify socket.
type activation struct {
	lns    []net.Listener // held by the test for the whole test
	files  []*os.File     // the same sockets, as the edge inherits them
	notify *net.UnixConn  // NOTIFY_SOCKET, read by the test
	path   string
}

// newActivation binds n loopback listeners and the notify socket.
func newActivation(t *testing.T, n int) *activation {
	t.Helper()
	a := &activation{path: filepath.Join(t.TempDir(), "notify")}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		f, err := ln.(*net.TCPListener).File()
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		a.lns, a.files = append(a.lns, ln), append(a.files, f)
	}
	var err error
	a.notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: a.path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.notify.Close() })
	return a
}

func (a *activation) addr(i int) string { return a.lns[i].Addr().String() }

// start starts the edge binary with args, the sockets as descriptors 3 and
// up, and env (LISTEN_*) added to the test's environment without any
// EDGEGUARD_, LISTEN_ or NOTIFY_ variable of its own. throughShell starts
// it as systemd does: LISTEN_PID is set, after the fork, to the pid the
// edge runs as (sh's $$, which exec keeps).
func (a *activation) start(t *testing.T, throughShell bool, env []string, args ...string) *upgradeEdge {
	t.Helper()
	u := &upgradeEdge{edgeProc: &edgeProc{}, bin: edgeBin, log: filepath.Join(t.TempDir(), "edge.log")}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--listen":
			u.Addr = args[i+1]
		case "--admin":
			u.Admin = args[i+1]
		}
	}
	cmd := exec.Command(edgeBin, args...)
	if throughShell {
		cmd = exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, edgeBin}, args...)...)
	}
	a.run(t, u, cmd, env)
	return u
}

// run starts cmd (the edge, or what execs it) for u, its output in u's
// log, with a's sockets as descriptors 3 and up and env added to the
// test's environment without any EDGEGUARD_, LISTEN_ or NOTIFY_ variable
// of its own.
func (a *activation) run(t *testing.T, u *upgradeEdge, cmd *exec.Cmd, env []string) {
	t.Helper()
	logFile, err := os.Create(u.log)
	require.NoError(t, err)
	defer logFile.Close() // the edge holds its own copy
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = a.files
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGEGUARD_") && !strings.HasPrefix(kv, "LISTEN_") && !strings.HasPrefix(kv, "NOTIFY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "EDGEGUARD_ADMIN_TOKEN="+adminToken)
	if a.path != "" {
		cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+a.path)
	}
	cmd.Env = append(cmd.Env, env...)
	u.Proc, err = testenv.StartProc(cmd)
	require.NoError(t, err)
	u.stopGroupAtEnd(t)
}

// next is the next datagram sent to the notify socket; the edge has within
// to send it.
func (a *activation) next(t *testing.T, within time.Duration) string {
	t.Helper()
	require.NoError(t, a.notify.SetReadDeadline(time.Now().Add(within)))
	buf := make([]byte, 4096)
	n, err := a.notify.Read(buf)
	require.NoError(t, err, "nothing sent to NOTIFY_SOCKET")
	return string(buf[:n])
}

// none asserts nothing waits on the notify socket (call it once the
// sender has exited: whatever it sent is queued by then).
func (a *activation) none(t *testing.T) {
	t.Helper()
	require.NoError(t, a.notify.SetReadDeadline(time.Now()))
	buf := make([]byte, 4096)
	n, err := a.notify.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "sent to NOTIFY_SOCKET: %q", buf[:n])
}

// inheritedFrom are the "listener inherited" lines' listener names coming
// from from, in order.
func (u *upgradeEdge) inheritedFrom(from string) []string {
	var names []string
	for _, l := range u.logLines("listener inherited") {
		if l["from"] == from {
			names = append(names, l["listener"].(string))
		}
	}
	return names
}

// TestSocketActivation: the edge started as systemd starts it for a socket
// unit (the sockets as descriptors 3 and 4, LISTEN_PID its own pid,
// LISTEN_FDS, LISTEN_FDNAMES, NOTIFY_SOCKET) serves HTTP and /readyz on
// those very sockets without binding any (the flags name the same
// addresses, which the test holds: binding them again would fail), tells
// the notify socket READY=1, and after a SIGUSR2 upgrade the new edge
// tells it MAINPID=<its pid> and serves on the same sockets.
func TestSocketActivation(t *testing.T) {
	org := startOrigin(t, 0)
	a := newActivation(t, 2)
	u := a.start(t, true, []string{"LISTEN_FDS=2", "LISTEN_FDNAMES=public:admin"},
		"--listen", a.addr(0), "--admin", a.addr(1), "--origin", org.URL, "--drain-delay", "0")
	pid := u.Cmd.Process.Pid

	require.Equal(t, "READY=1", a.next(t, 20*time.Second), u.logTail(20))
	require.NoError(t, waitReady(u.edgeProc, 20*time.Second), u.logTail(20))
	serving := u.waitLog(t, "edge serving", 1, 10*time.Second)
	require.Equal(t, float64(pid), serving["pid"], "LISTEN_PID is not the edge's pid")
	require.Equal(t, []string{"public", "admin"}, u.inheritedFrom("systemd"))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r := get(client, u.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)

	require.NoError(t, syscall.Kill(pid, syscall.SIGUSR2))
	state := a.next(t, 30*time.Second)
	newPID, ok := strings.CutPrefix(state, "MAINPID=")
	require.True(t, ok, "after the upgrade: %q", state)
	newPID, ok = strings.CutSuffix(newPID, "\nREADY=1")
	require.True(t, ok, "after the upgrade: %q", state)
	line := u.waitLog(t, "upgrade: the new edge is ready; this edge stops accepting and drains", 1, 30*time.Second)
	require.Equal(t, newPID, strconv.Itoa(int(line["new_pid"].(float64))))
	require.NotEqual(t, strconv.Itoa(pid), newPID)
	code, exitedOK := u.WaitExit(15 * time.Second)
	require.True(t, exitedOK, "the old edge did not exit after the upgrade")
	require.Zero(t, code)
	// The new edge took both sockets from the old one (not from systemd's
	// variables, cleared before the upgrade) and alone serves them now.
	require.Equal(t, []string{"public", "admin"}, u.inheritedFrom("handoff"))
	require.Len(t, u.inheritedFrom("systemd"), 2)
	n, err := strconv.Atoi(newPID)
	require.NoError(t, err)
	require.False(t, exited(n), "the new edge %d is gone", n)
	r = get(client, u.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)
	r = get(client, "http://"+u.Admin+"/readyz")
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)
}

// TestSocketActivationRefusesWhatIsNotPassed: LISTEN_FDS counting more
// descriptors than were passed, or counting one that is no socket, makes
// the edge refuse to start and say which descriptor is wrong, rather than
// take whatever file has that number (the Go runtime opens some of its own
// at start-up) or bind sockets itself; no READY=1.
func TestSocketActivationRefusesWhatIsNotPassed(t *testing.T) {
	for _, tc := range []struct {
		name string
		file bool   // a regular file passed as descriptor 5
		err  string // a regular expression
	}{
		{"one more than passed", false, `^LISTEN_FDS: descriptor 5 \(unknown\) is not (open|a socket)`},
		{"a file among the sockets", true, `^LISTEN_FDS: descriptor 5 \(unknown\) is not a socket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newActivation(t, 2)
			if tc.file {
				f, err := os.Open(os.DevNull)
				require.NoError(t, err)
				t.Cleanup(func() { _ = f.Close() })
				a.files = append(a.files, f)
			}
			u := a.start(t, true, []string{"LISTEN_FDS=3"},
				"--listen", a.addr(0), "--admin", a.addr(1), "--origin", "http://127.0.0.1:9", "--drain-delay", "0")
			code, exitedOK := u.WaitExit(20 * time.Second)
			require.True(t, exitedOK, "the edge started:\n%s", u.logTail(20))
			require.Equal(t, 1, code)
			refused := u.logLines("edge refused to start")
			require.Len(t, refused, 1, u.logTail(20))
			require.Regexp(t, tc.err, refused[0]["err"])
			require.Empty(t, u.logLines("listener inherited"))
			a.none(t)
		})
	}
}

// TestSocketActivationForAnotherProcess: sockets passed with LISTEN_PID
// naming another process (here the test's) are not the edge's: it ignores
// them, as sd_listen_fds does, and binds what its flags say.
func TestSocketActivationForAnotherProcess(t *testing.T) {
	org := startOrigin(t, 0)
	a := newActivation(t, 2)
	ports := freePorts(t, 2)
	u := a.start(t, false, []string{"LISTEN_PID=" + strconv.Itoa(os.Getpid()), "LISTEN_FDS=2", "LISTEN_FDNAMES=public:admin"},
		"--listen", "127.0.0.1:"+strconv.Itoa(ports[0]), "--admin", "127.0.0.1:"+strconv.Itoa(ports[1]),
		"--origin", org.URL, "--drain-delay", "0")
	require.Equal(t, "READY=1", a.next(t, 20*time.Second), u.logTail(20))
	require.NoError(t, waitReady(u.edgeProc, 20*time.Second), u.logTail(20))
	require.Empty(t, u.logLines("listener inherited"))
	r := get(&http.Client{Timeout: 5 * time.Second}, u.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)
	// The passed public socket is still the test's alone: a connection to
	// it waits for the test's Accept.
	c, err := net.DialTimeout("tcp", a.addr(0), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, a.lns[0].(*net.TCPListener).SetDeadline(time.Now().Add(10*time.Second)))
	got, err := a.lns[0].Accept()
	require.NoError(t, err, "the connection was taken by another process")
	require.NoError(t, got.Close())
}

// TestSocketActivationBySystemdsLauncher: systemd's own launcher,
// systemd-socket-activate (package systemd), binds the public port, waits
// for the first connection and only then execs the edge, with
// LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES set as a socket unit sets
// them. The connection made before any edge ran waits in the socket's
// queue and is answered, which is what the packaged .socket unit
// promises across a restart; the edge serves on the socket systemd named
// "public" (it would fail to bind the port itself: the launcher holds
// it), and a SIGUSR2 upgrade hands that socket on.
func TestSocketActivationBySystemdsLauncher(t *testing.T) {
	launcher, err := exec.LookPath("systemd-socket-activate")
	require.NoError(t, err, "systemd-socket-activate is missing: apt-get install systemd")
	org := startOrigin(t, 0)
	ports, err := testenv.FreePorts(2)
	require.NoError(t, err)
	addr, admin := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
	u := &upgradeEdge{edgeProc: &edgeProc{}, bin: edgeBin, log: filepath.Join(t.TempDir(), "edge.log")}
	u.Addr, u.Admin = addr, admin
	a := &activation{}
	a.run(t, u, exec.Command(launcher, "-l", addr, "--fdname=public", "-E", "EDGEGUARD_ADMIN_TOKEN="+adminToken,
		edgeBin, "--listen", addr, "--admin", admin, "--origin", org.URL, "--drain-delay", "0"), nil)
	launcherPID := u.Cmd.Process.Pid

	// The launcher has bound the port once it says so; the edge does not
	// exist until a connection arrives.
	require.NoError(t, proc.PollEvery(testenv.Within(t, 20*time.Second), 10*time.Millisecond, "the launcher listening", func(context.Context) error {
		if !strings.Contains(u.output(), "Listening on "+addr) {
			return errors.New(u.output())
		}
		return nil
	}))
	require.NotContains(t, u.output(), "edge serving", "the launcher started the edge before any connection")

	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r := get(client, u.url("/")) // waits in the queue while the edge starts
	require.NoError(t, r.err, u.logTail(20))
	require.Equal(t, http.StatusOK, r.code, u.logTail(20))
	require.NotZero(t, org.arrived.Load(), "answered without the origin")
	serving := u.waitLog(t, "edge serving", 1, 10*time.Second)
	require.Equal(t, float64(launcherPID), serving["pid"], "the launcher execs the edge in its own process, as systemd does")
	require.Equal(t, []string{"public"}, u.inheritedFrom("systemd"))
	require.NoError(t, waitReady(u.edgeProc, 20*time.Second), u.logTail(20))

	require.NoError(t, syscall.Kill(launcherPID, syscall.SIGUSR2))
	line := u.waitLog(t, "upgrade: the new edge is ready; this edge stops accepting and drains", 1, 30*time.Second)
	newPID := int(line["new_pid"].(float64))
	require.NotEqual(t, launcherPID, newPID)
	code, exitedOK := u.WaitExit(15 * time.Second)
	require.True(t, exitedOK, "the old edge did not exit after the upgrade")
	require.Zero(t, code)
	require.Equal(t, []string{"public", "admin"}, u.inheritedFrom("handoff"))
	require.False(t, exited(newPID), "the new edge %d is gone", newPID)
	r = get(client, u.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code)
}
