package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The stall pulser (scripts/busy.sh) finds a server by pulse.lock in its
// working directory and leaves one alone while frozen-<pid> marks it frozen
// by its test: Freeze sets the mark, Thaw removes it.
func TestFreezeMarksServerForPulser(t *testing.T) {
	t.Parallel()
	s, err := StartStandalone(StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Thaw(); _ = s.Close() })
	pid := s.proc().Cmd.Process.Pid
	cwd := "/proc/" + strconv.Itoa(pid) + "/cwd"
	_, err = os.Stat(cwd)
	require.NoError(t, err, "the pulser finds a server's working directory through /proc (Linux)")
	require.FileExists(t, filepath.Join(cwd, pulseLock))
	mark := filepath.Join(cwd, frozenPrefix+strconv.Itoa(pid))
	require.NoFileExists(t, mark)

	s.Freeze()
	require.FileExists(t, mark)
	require.Eventually(t, func() bool { return procState(pid) == "T" }, 10*time.Second, 5*time.Millisecond)

	s.Thaw()
	require.NoFileExists(t, mark)
	requireAnswers(t, s)
}

// An exempt server keeps the mark through its test's own freezes and thaws,
// so that no stall lands between them, until the exemption is released. A
// stall under way as the exemption starts is ended by it: the pulser does
// not resume a marked server.
func TestExemptKeepsPulserOffThroughFreezes(t *testing.T) {
	t.Parallel()
	s, err := StartStandalone(StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Thaw(); _ = s.Close() })
	p := s.proc()
	pid := p.Cmd.Process.Pid
	mark := filepath.Join(s.d.dir, frozenPrefix+strconv.Itoa(pid))

	p.signal(syscall.SIGSTOP) // a stall, as the pulser sends it: no mark
	require.Eventually(t, func() bool { return procState(pid) == "T" }, 10*time.Second, 5*time.Millisecond)
	release := s.d.exempt(p)
	require.FileExists(t, mark)
	require.Eventually(t, func() bool { return procState(pid) != "T" }, 10*time.Second, 5*time.Millisecond,
		"the exemption ended the stall under way")

	for range 2 {
		s.Freeze()
		require.FileExists(t, mark)
		s.Thaw()
		require.FileExists(t, mark, "still exempt between the test's freezes")
	}
	second := s.d.exempt(p)
	release()
	release() // twice: counts once
	require.FileExists(t, mark, "one exemption still holds")
	second()
	require.NoFileExists(t, mark)

	s.Freeze()
	release2 := s.d.exempt(p)
	require.Eventually(t, func() bool { return procState(pid) == "T" }, 10*time.Second, 5*time.Millisecond)
	release2()
	require.FileExists(t, mark, "frozen by the test: marked after the exemption ends")
	require.Equal(t, "T", procState(pid), "an exemption does not resume what the test froze")
	s.Thaw()
	require.NoFileExists(t, mark)
	requireAnswers(t, s)
}

// requireAnswers checks that a thawed server answers a PING.
func requireAnswers(t *testing.T, s *Standalone) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newClient(s.Addr)
	defer c.Close()
	require.NoError(t, c.Ping(ctx).Err())
}

// procState is the state letter of /proc/pid/stat ("" when unreadable).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	state, _, _ := strings.Cut(rest, " ")
	return state
}
