package handoff

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Environment variables: the edge's own handoff, and systemd's socket
// activation (sd_listen_fds(3)).
const (
	EnvListenFDs     = "EDGEGUARD_LISTEN_FDS"
	envSystemdPID    = "LISTEN_PID"
	envSystemdFDs    = "LISTEN_FDS"
	envSystemdNames  = "LISTEN_FDNAMES"
	firstFD          = 3
	maxInheritedFDs  = 16 // far more than the edge has listeners
	readyName        = "ready"
	systemdNameLimit = 255
)

// Listener names, in EDGEGUARD_LISTEN_FDS and as a socket unit's
// FileDescriptorName=.
const (
	Public = "public"
	TLS    = "tls"
	Admin  = "admin"
	RLS    = "rls"
)

var listenerNames = []string{Public, TLS, Admin, RLS}

// Set is the sockets a process was started with.
type Set struct {
	From  string // "handoff" or "systemd"; empty without inherited sockets
	files []*os.File
	names []string
	ready *os.File // handoff only: written once the edge answers ready
}

// Inherited reads the inherited sockets from the environment and clears the
// variables that named them, so no process the edge starts mistakes them for
// its own. With neither variable set it is an empty Set; a variable that
// does not describe valid descriptors is an error (the edge refuses to start
// rather than bind sockets its predecessor still holds).
func Inherited() (*Set, error) {
	s, err := inherited(os.Getenv, os.Getpid())
	for _, v := range []string{EnvListenFDs, envSystemdPID, envSystemdFDs, envSystemdNames} {
		_ = os.Unsetenv(v)
	}
	return s, err
}

func inherited(getenv func(string) string, pid int) (*Set, error) {
	if v := getenv(EnvListenFDs); v != "" {
		names := strings.Split(v, ":")
		if len(names) > maxInheritedFDs {
			return nil, fmt.Errorf("%s: %d descriptors, at most %d", EnvListenFDs, len(names), maxInheritedFDs)
		}
		// Every name checked before any descriptor is taken.
		for i, name := range names {
			if name != readyName && !slices.Contains(listenerNames, name) {
				return nil, fmt.Errorf("%s: unknown name %q (want %s or %s)", EnvListenFDs, name, strings.Join(listenerNames, ", "), readyName)
			}
			if slices.Contains(names[:i], name) {
				return nil, fmt.Errorf("%s: %q named twice", EnvListenFDs, name)
			}
		}
		s := &Set{From: "handoff"}
		for i, name := range names {
			f, err := fdFile(firstFD+i, name, name == readyName)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", EnvListenFDs, err)
			}
			if name == readyName {
				s.ready = f
				continue
			}
			s.files, s.names = append(s.files, f), append(s.names, name)
		}
		return s, nil
	}
	v := getenv(envSystemdFDs)
	if v == "" {
		return &Set{}, nil
	}
	if p, err := strconv.Atoi(getenv(envSystemdPID)); err != nil || p != pid {
		return &Set{}, nil // meant for another process (sd_listen_fds ignores them too)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxInheritedFDs {
		return nil, fmt.Errorf("%s=%q: want a count from 1 to %d", envSystemdFDs, v, maxInheritedFDs)
	}
	var names []string
	if nv := getenv(envSystemdNames); nv != "" {
		names = strings.Split(nv, ":")
		if len(names) != n {
			return nil, fmt.Errorf("%s names %d descriptors, %s says %d", envSystemdNames, len(names), envSystemdFDs, n)
		}
	}
	s := &Set{From: "systemd"}
	for i := range n {
		name := "unknown" // systemd's own default
		if names != nil && len(names[i]) <= systemdNameLimit {
			name = names[i]
		}
		f, err := fdFile(firstFD+i, name, false)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envSystemdFDs, err)
		}
		s.files, s.names = append(s.files, f), append(s.names, name)
	}
	return s, nil
}

// fdFile is fd as a file, refused when it is not open or not what was
// passed: a socket, or a pipe for the handoff's readiness descriptor. A
// count naming more descriptors than were passed reaches the ones this
// process opened itself (the Go runtime keeps its cgroup CPU limit files
// open from start-up): those are refused, never taken and closed.
func fdFile(fd int, name string, pipe bool) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("descriptor %d (%s) is not open: %w", fd, name, err)
	}
	want, kind := uint32(unix.S_IFSOCK), "a socket"
	if pipe {
		want, kind = unix.S_IFIFO, "a pipe"
	}
	if st.Mode&unix.S_IFMT != want {
		return nil, fmt.Errorf("descriptor %d (%s) is not %s", fd, name, kind)
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name), nil
}

// Listener takes the inherited socket for the listener named name (or,
// when no socket carries that name, the one listening on addr: a socket
// unit names all its sockets alike). ok is false when none was inherited:
// the caller binds addr itself.
func (s *Set) Listener(name, addr string) (ln net.Listener, ok bool, err error) {
	if s == nil {
		return nil, false, nil
	}
	i := slices.Index(s.names, name)
	if i < 0 {
		i = s.byAddr(addr)
	}
	if i < 0 {
		return nil, false, nil
	}
	f := s.files[i]
	s.files = slices.Delete(s.files, i, i+1)
	s.names = slices.Delete(s.names, i, i+1)
	defer f.Close() // FileListener holds a copy
	ln, err = net.FileListener(f)
	if err != nil {
		return nil, false, fmt.Errorf("inherited socket %q: %w", name, err)
	}
	if _, tcp := ln.(*net.TCPListener); !tcp {
		_ = ln.Close()
		return nil, false, fmt.Errorf("inherited socket %q is not a TCP listener", name)
	}
	return ln, true, nil
}

// byAddr is the index of the socket, named none of the listeners' names,
// that listens on addr; -1 when there is none.
func (s *Set) byAddr(addr string) int {
	want, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil || want.Port == 0 {
		return -1
	}
	for i, f := range s.files {
		if slices.Contains(listenerNames, s.names[i]) {
			continue
		}
		sa, err := sockname(f)
		if err != nil {
			continue
		}
		var ip net.IP
		var port int
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			ip, port = a.Addr[:], a.Port
		case *syscall.SockaddrInet6:
			ip, port = a.Addr[:], a.Port
		default:
			continue
		}
		if port == want.Port && (ip.Equal(want.IP) || (ip.IsUnspecified() && (want.IP == nil || want.IP.IsUnspecified()))) {
			return i
		}
	}
	return -1
}

// Close closes the sockets no listener took and returns their names, for
// the log: a socket passed but not used is a configuration mistake.
func (s *Set) Close() []string {
	if s == nil {
		return nil
	}
	names := s.names
	for _, f := range s.files {
		_ = f.Close()
	}
	s.files, s.names = nil, nil
	return names
}

// Ready tells the edge that started this one that it answers ready; it
// does nothing without one. It is idempotent.
func (s *Set) Ready() error {
	if s == nil || s.ready == nil {
		return nil
	}
	f := s.ready
	s.ready = nil
	_, err := f.Write([]byte("ready\n"))
	return errors.Join(err, f.Close())
}

// Upgrading reports whether an edge started this one and waits for Ready.
func (s *Set) Upgrading() bool { return s != nil && s.ready != nil }

// sockname is f's local address, read without Fd (which would make the
// socket, shared with the edge that passed it, blocking).
func sockname(f *os.File) (syscall.Sockaddr, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var sa syscall.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = syscall.Getsockname(int(fd)) }); err != nil {
		return nil, err
	}
	return sa, serr
}
