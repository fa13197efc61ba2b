package handoff

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestInheritedRefusesWhatNamesNoValidSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		err  string // empty: an empty set, nothing inherited
	}{
		{"nothing", nil, ""},
		{"unknown name", map[string]string{EnvListenFDs: "public:metrics"}, `unknown name "metrics"`},
		{"named twice", map[string]string{EnvListenFDs: "public:public"}, `"public" named twice`},
		{"too many", map[string]string{EnvListenFDs: "public:tls:admin:rls:ready:x:x:x:x:x:x:x:x:x:x:x:x"}, "at most 16"},
		{"systemd, another pid", map[string]string{"LISTEN_PID": "1", "LISTEN_FDS": "2"}, ""},
		{"systemd, garbage pid", map[string]string{"LISTEN_PID": "x", "LISTEN_FDS": "2"}, ""},
		{"systemd, garbage count", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "-3"}, "want a count from 1 to 16"},
		{"systemd, too many", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "100000"}, "want a count from 1 to 16"},
		{"systemd, names do not match the count", map[string]string{"LISTEN_PID": "42", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "public"}, "names 1 descriptors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := inherited(func(k string) string { return tc.env[k] }, 42)
			if tc.err == "" {
				require.NoError(t, err)
				require.Empty(t, s.Close())
				require.False(t, s.Upgrading())
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestDescriptorNotPassedIsRefused(t *testing.T) {
	// One above every descriptor open now stands for one not passed.
	f, err := os.Open(os.DevNull)
	require.NoError(t, err)
	free := int(f.Fd()) + 1
	require.NoError(t, f.Close())
	_, err = fdFile(free, Public, false)
	require.ErrorContains(t, err, "is not open")
}

// TestDescriptorOfAnotherKindIsRefused: a count past the passed
// descriptors reaches files the process opened itself; they are refused,
// not taken (and later closed) as sockets.
func TestDescriptorOfAnotherKindIsRefused(t *testing.T) {
	file, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer file.Close()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	sock, _ := listenerFile(t)
	for _, tc := range []struct {
		name string
		f    *os.File
		pipe bool
		err  string // empty: taken
	}{
		{"a file as a socket", file, false, "is not a socket"},
		{"a pipe as a socket", w, false, "is not a socket"},
		{"a socket as the pipe", sock, true, "is not a pipe"},
		{"a file as the pipe", file, true, "is not a pipe"},
		{"a socket", sock, false, ""},
		{"the pipe", w, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A copy: a file fdFile returns owns its descriptor.
			fd, err := unix.Dup(int(tc.f.Fd()))
			require.NoError(t, err)
			got, err := fdFile(fd, Public, tc.pipe)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.NoError(t, unix.Close(fd))
				return
			}
			require.NoError(t, err)
			require.NoError(t, got.Close())
		})
	}
}

// listenerFile is a bound loopback listener's descriptor, as a process
// inherits it.
func listenerFile(t *testing.T) (*os.File, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f, ln.Addr().String()
}

func TestListenerByNameThenByAddress(t *testing.T) {
	pub, pubAddr := listenerFile(t)
	unit, unitAddr := listenerFile(t)
	s := &Set{From: "systemd", files: []*os.File{pub, unit}, names: []string{Public, "edgeguard-edge.socket"}}

	ln, ok, err := s.Listener(Admin, "127.0.0.1:1") // neither name nor address
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, ln)

	ln, ok, err = s.Listener(Public, "127.0.0.1:0")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, pubAddr, ln.Addr().String())
	serves(t, ln)

	ln, ok, err = s.Listener(TLS, unitAddr) // the unit's name: matched by address
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, unitAddr, ln.Addr().String())
	serves(t, ln)
	require.Empty(t, s.Close())
}

func TestUnusedSocketsAreNamed(t *testing.T) {
	f, _ := listenerFile(t)
	s := &Set{From: "handoff", files: []*os.File{f}, names: []string{RLS}}
	require.Equal(t, []string{RLS}, s.Close())
}

func TestNotInheritedSocketIsRefused(t *testing.T) {
	f, err := os.Open(filepath.Join(t.TempDir()))
	require.NoError(t, err)
	s := &Set{From: "handoff", files: []*os.File{f}, names: []string{Public}}
	_, _, err = s.Listener(Public, ":80")
	require.ErrorContains(t, err, `inherited socket "public"`)
}

// serves accepts one connection on ln.
func serves(t *testing.T, ln net.Listener) {
	t.Helper()
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			_ = c.Close()
		}
	}()
	c, err := ln.Accept()
	require.NoError(t, err)
	_ = c.Close()
}

func TestNotifyWritesTheStateToTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	require.NoError(t, Notify(ReadyState(true)))
	buf := make([]byte, 128)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "MAINPID="+strconv.Itoa(os.Getpid())+"\nREADY=1", string(buf[:n]))

	t.Setenv("NOTIFY_SOCKET", "relative")
	require.ErrorContains(t, Notify("READY=1"), "want an absolute path")
	t.Setenv("NOTIFY_SOCKET", "")
	require.NoError(t, Notify("READY=1"))
}
