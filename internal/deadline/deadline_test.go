package deadline_test

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/deadline"
)

// counter counts the deadlines set on the connection under a Conn.
type counter struct {
	net.Conn
	reads, writes atomic.Int32
}

func (c *counter) SetReadDeadline(t time.Time) error {
	c.reads.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c *counter) SetWriteDeadline(t time.Time) error {
	c.writes.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

// pair is a Conn over one end of a pipe, its deadlines counted, and the
// other end.
func pair(t *testing.T) (*deadline.Conn, *counter, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	sock := &counter{Conn: a}
	return deadline.Lazy(sock), sock, b
}

// Deadlines moved later are recorded, not set: a hundred exchanges, each
// moving both, set each on the socket once.
func TestLaterDeadlinesAreKept(t *testing.T) {
	c, sock, peer := pair(t)
	go func() { _, _ = io.Copy(peer, peer) }() // an echo
	buf := make([]byte, 3)
	for range 100 {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
		require.NoError(t, c.SetDeadline(time.Now().Add(2*time.Minute)))
		_, err := c.Write([]byte("abc"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), sock.reads.Load())
	require.Equal(t, int32(1), sock.writes.Load())
}

// wait runs op and returns its error, failing t if it has not returned
// within a minute.
func wait(t *testing.T, op func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("never returned")
		return nil
	}
}

// A read or a write times out when the deadline last asked for passes:
// not at an earlier one the socket still had, and at once when the one
// asked for is earlier than the socket's.
func TestTimesOutAtTheDeadlineAskedFor(t *testing.T) {
	for name, deadlines := range map[string][2]time.Duration{
		"moved later":   {30 * time.Millisecond, 300 * time.Millisecond},
		"moved earlier": {time.Hour, 100 * time.Millisecond},
	} {
		t.Run(name+", read", func(t *testing.T) {
			c, _, _ := pair(t)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(deadlines[0])))
			ask := time.Now().Add(deadlines[1])
			require.NoError(t, c.SetReadDeadline(ask))
			err := wait(t, func() error { _, err := c.Read(make([]byte, 1)); return err })
			require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
			require.False(t, time.Now().Before(ask), "timed out before the deadline asked for")
		})
		t.Run(name+", write", func(t *testing.T) {
			c, _, _ := pair(t) // nobody reads: a pipe's write waits for its reader
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(deadlines[0])))
			ask := time.Now().Add(deadlines[1])
			require.NoError(t, c.SetWriteDeadline(ask))
			err := wait(t, func() error { _, err := c.Write([]byte("x")); return err })
			require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
			require.False(t, time.Now().Before(ask), "timed out before the deadline asked for")
		})
	}
}

// A deadline cleared after a shorter one was set does not end a read at
// the shorter one.
func TestClearedDeadlineHolds(t *testing.T) {
	c, _, peer := pair(t)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Millisecond)))
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	// The peer writes once the cleared deadline is well past: the
	// subject is the clock.
	timer := time.AfterFunc(200*time.Millisecond, func() { _, _ = peer.Write([]byte("x")) })
	defer timer.Stop()
	n, err := c.Read(make([]byte, 1))
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A past deadline set from another goroutine ends a read, whether it
// comes while the read waits or just before it starts (how the origin's
// streams are ended on shutdown), though the socket had a later one.
func TestPastDeadlineEndsAReadUnderWay(t *testing.T) {
	c, _, _ := pair(t)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))
	started := make(chan struct{})
	go func() {
		<-started
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}()
	err := wait(t, func() error {
		close(started)
		_, err := c.Read(make([]byte, 1))
		return err
	})
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
}
