package faults_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeguard/edgeguard/internal/faults"
	"github.com/edgeguard/edgeguard/internal/leakcheck"
)

// echo serves line echo on loopback until the test ends.
func echo(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends one line on c and reads the echo, within d.
func roundTrip(c net.Conn, d time.Duration) (time.Duration, error) {
	start := time.Now()
	if err := c.SetDeadline(start.Add(d)); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return time.Since(start), err
}

// The helper's faults do what the matrix relies on: a toxic reaches a live
// connection, Clear lifts it, Cut breaks live connections and refuses new
// ones, Restore serves again on the same address.
func TestNet(t *testing.T) {
	addr := echo(t)
	n := faults.NewNet()
	t.Cleanup(n.Close)
	ctx := context.Background()

	c, err := n.Dial(ctx, "tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = roundTrip(c, 5*time.Second)
	require.NoError(t, err)

	require.NoError(t, n.Add(faults.Toxic{Name: "slow", Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 200}}))
	took, err := roundTrip(c, 5*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, took, 200*time.Millisecond, "latency toxic on a live connection")

	n.Clear()
	require.NoError(t, n.Add(faults.Toxic{Name: "hole", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}))
	_, err = roundTrip(c, 300*time.Millisecond)
	require.Error(t, err, "a black-holed connection answers nothing")
	n.Clear()

	c2, err := n.Dial(ctx, "tcp", addr)
	require.NoError(t, err)
	defer c2.Close()
	_, err = roundTrip(c2, 5*time.Second)
	require.NoError(t, err)

	n.Cut()
	_, err = roundTrip(c2, 5*time.Second)
	require.Error(t, err, "a cut link breaks live connections")
	_, err = n.Dial(ctx, "tcp", addr)
	require.Error(t, err, "a cut link refuses new connections")

	require.NoError(t, n.Restore())
	c3, err := n.Dial(ctx, "tcp", addr)
	require.NoError(t, err)
	defer c3.Close()
	_, err = roundTrip(c3, 5*time.Second)
	require.NoError(t, err)
}

// Remove takes one toxic off and lets through what a latency toxic held:
// a reply held for a minute arrives once the toxic is removed, and the
// other toxics stay.
func TestNetRemove(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	echoed := make(chan struct{}, 1) // the server wrote its reply
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
			echoed <- struct{}{}
		}
	}()
	n := faults.NewNet()
	t.Cleanup(n.Close)
	c, err := n.Dial(context.Background(), "tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, n.Add(faults.Toxic{Name: "held", Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 60000}}))
	require.NoError(t, n.Add(faults.Toxic{Name: "slow", Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 100}}))
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Write([]byte("ping\n"))
	require.NoError(t, err)
	<-echoed // the reply is on its way back, into the hold
	require.NoError(t, n.Remove("held"))
	_, err = bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "the held reply arrives once its toxic is removed, not after a minute")
	took, err := roundTrip(c, 5*time.Second)
	require.NoError(t, err)
	<-echoed
	require.GreaterOrEqual(t, took, 100*time.Millisecond, "the other toxic stays")
	require.Error(t, n.Remove("held"), "no toxic of that name left")
}

// A proxy stopped while bytes flow through it (Cut, Close) leaves
// toxiproxy's goroutines blocked for good: the link's writer quits on its
// failed write, and its toxics' stubs and its reader wait forever on
// channels nobody reads. They are toxiproxy's, not the code under test's,
// and leakcheck does not count them; everything else of a stopped Net
// must be gone.
func TestCutMidStreamLeavesToxiproxysStubs(t *testing.T) {
	before, stuckBefore := goleak.IgnoreCurrent(), stuckStubs()
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	stuck := false
	for round := 0; round < 50 && !stuck; round++ {
		n := faults.NewNet()
		c, err := n.Dial(context.Background(), "tcp", srv.Addr().String())
		require.NoError(t, err)
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			buf := make([]byte, 4096)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		time.Sleep(10 * time.Millisecond)
		n.Cut()
		<-wrote
		_ = c.Close()
		n.Close()
		stuck = newStubBlocked(stuckBefore)
	}
	// The witness: the rounds did leave a stub blocked (if toxiproxy
	// stops doing so, leakcheck's exception can go).
	require.True(t, stuck, "no toxiproxy stub was left blocked after 50 cuts mid-stream")
	require.NoError(t, srv.Close())
	<-served
	require.NoError(t, leakcheck.Find(before))
	// Without the exception the same goroutines are reported.
	require.Error(t, goleak.Find(before))
}

// stuckStubs is the goroutines (by their "goroutine N" header) of
// toxiproxy stubs blocked handing on a chunk.
func stuckStubs() map[string]bool {
	buf := make([]byte, 1<<20)
	all := string(buf[:runtime.Stack(buf, true)])
	out := map[string]bool{}
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "[chan send") && strings.Contains(g, "toxics.(*ToxicStub).Run") {
			out[strings.SplitN(g, " [", 2)[0]] = true
		}
	}
	return out
}

// newStubBlocked reports whether a stub not in old is blocked, once the
// goroutines have settled (up to a second).
func newStubBlocked(old map[string]bool) bool {
	deadline := time.Now().Add(time.Second)
	for {
		for g := range stuckStubs() {
			if !old[g] {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
