package handoff

import (
	"log/slog"
	"net"
	"os"
)

// Sockets are a process's listening sockets: those it inherited, and each
// listener as bound, kept for the next binary on SIGUSR2.
type Sockets struct {
	Inherited *Set // nil: none
	Bound     []Named
	Exe       string // this binary's path, for SIGUSR2
	log       *slog.Logger
}

// NewSockets resolves this binary's path now: the path, not the file, is
// re-read on SIGUSR2.
func NewSockets(inherited *Set, log *slog.Logger) *Sockets {
	exe, _ := os.Executable()
	return &Sockets{Inherited: inherited, Exe: exe, log: log}
}

// Binder is Bind for the listener named name.
func (s *Sockets) Binder(name string) func(addr string) (net.Listener, error) {
	return func(addr string) (net.Listener, error) { return s.Bind(name, addr) }
}

// Bind is the listener named name: the inherited socket when there is one,
// else a new one on addr. Either way it is kept for the next binary.
func (s *Sockets) Bind(name, addr string) (net.Listener, error) {
	ln, ok, err := s.Inherited.Listener(name, addr)
	if err != nil {
		return nil, err
	}
	if ok {
		s.log.Info("listener inherited", "listener", name, "addr", ln.Addr().String(), "from", s.Inherited.From)
	} else if ln, err = net.Listen("tcp", addr); err != nil {
		return nil, err
	}
	s.Bound = append(s.Bound, Named{Name: name, Ln: ln})
	return ln, nil
}
