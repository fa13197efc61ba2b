package handoff

import (
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bind takes the inherited socket when there is one, binds otherwise, and
// keeps either for the next binary; a refused socket or address keeps
// nothing.
func TestSocketsBindKeepsEachListener(t *testing.T) {
	f, inheritedAddr := listenerFile(t)
	bad, err := os.Open(t.TempDir())
	require.NoError(t, err)
	s := NewSockets(&Set{From: "handoff", files: []*os.File{f, bad}, names: []string{Public, TLS}}, slog.New(slog.DiscardHandler))
	require.NotEmpty(t, s.Exe, "this binary's path")

	pub, err := s.Bind(Public, "127.0.0.1:0")
	require.NoError(t, err)
	require.Equal(t, inheritedAddr, pub.Addr().String(), "the inherited socket")
	admin, err := s.Bind(Admin, "127.0.0.1:0")
	require.NoError(t, err)
	require.NotEqual(t, inheritedAddr, admin.Addr().String(), "a new socket")

	_, err = s.Bind(TLS, "127.0.0.1:0")
	require.ErrorContains(t, err, `inherited socket "tls"`)
	_, err = s.Bind(RLS, "127.0.0.1:-1")
	require.Error(t, err)

	require.Equal(t, []Named{{Name: Public, Ln: pub}, {Name: Admin, Ln: admin}}, s.Bound)
	serves(t, pub)
	serves(t, admin)
}

// Without inherited sockets (nil Set) every listener is bound.
func TestSocketsBindWithoutInherited(t *testing.T) {
	s := NewSockets(nil, slog.New(slog.DiscardHandler))
	ln, err := s.Bind(Public, "127.0.0.1:0")
	require.NoError(t, err)
	require.Equal(t, []Named{{Name: Public, Ln: ln}}, s.Bound)
	serves(t, ln)
}
