package faults_test

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/faults"
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
