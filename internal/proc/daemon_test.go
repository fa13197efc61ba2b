package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDaemonEnsureStop(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	d := Daemon{Name: "sleeper", Dir: t.TempDir(), Bin: sleep, Args: []string{"60"}}
	require.Zero(t, d.Pid(), "nothing runs before start")

	started, err := d.Ensure()
	require.NoError(t, err)
	require.True(t, started)
	pid := d.Pid()
	require.NotZero(t, pid)

	started, err = d.Ensure()
	require.NoError(t, err)
	require.False(t, started, "a running daemon is not started twice")
	require.Equal(t, pid, d.Pid())

	// A pid file naming another program's process does not count as ours.
	other := Daemon{Name: "sleeper", Dir: d.Dir, Bin: "/bin/true"}
	require.Zero(t, other.Pid())

	d.Stop(2 * time.Second)
	require.Zero(t, RunningAs(pid, sleep), "Stop returns once the process is gone")
	_, err = os.Stat(d.PidPath())
	require.True(t, os.IsNotExist(err), "pid file removed")
}

// A daemon that exits while WaitAlive waits fails the wait at once, with
// the end of its log, instead of running out the context.
func TestDaemonWaitAliveFailsWhenItExits(t *testing.T) {
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	d := Daemon{Name: "quitter", Dir: t.TempDir(), Bin: sh, Args: []string{"-c", "echo refusing to start; exit 3"}}
	_, err = d.Start()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err = d.WaitAlive(ctx, "quitter", func(context.Context) error { return errors.New("not yet") })
	require.ErrorContains(t, err, "process exited")
	require.ErrorContains(t, err, "refusing to start")
	require.Less(t, time.Since(start), 30*time.Second, "not the context's deadline")
}

func TestPoll(t *testing.T) {
	ctx := context.Background()
	t.Run("until the check passes", func(t *testing.T) {
		n := 0
		require.NoError(t, Poll(ctx, "three tries", func(context.Context) error {
			if n++; n < 3 {
				return errors.New("not yet")
			}
			return nil
		}))
		require.Equal(t, 3, n)
	})
	t.Run("a permanent error ends it", func(t *testing.T) {
		n := 0
		errBroken := errors.New("broken")
		err := Poll(ctx, "nothing", func(context.Context) error { n++; return Permanent(errBroken) })
		require.ErrorIs(t, err, errBroken)
		require.ErrorContains(t, err, "waiting for nothing")
		require.Equal(t, 1, n)
	})
	t.Run("the context ends it with the last error", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		errLast := errors.New("still down")
		err := PollEvery(ctx, 10*time.Millisecond, "nothing", func(context.Context) error { return errLast })
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, errLast)
	})
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	var lines []byte
	for i := range TailLines + 10 {
		lines = append(lines, []byte("line "+string(rune('a'+i%26))+"\n")...)
	}
	require.NoError(t, os.WriteFile(path, lines, 0o600))
	got := Tail(path)
	require.Len(t, strings.Split(got, "\n"), TailLines)
	require.Contains(t, Tail(filepath.Join(t.TempDir(), "missing.log")), "reading")
	require.Equal(t, "b\nc", LastLines("a\nb\nc\n", 2))
	require.Equal(t, "a", LastLines("a", 5))
}
