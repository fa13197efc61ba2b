package lifecycle

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Shutdown stops every server, letting what each has in flight finish
// within Timeout. Cut, HTTP2, RLS and Tunnels may be nil (none to stop).
type Shutdown struct {
	Timeout time.Duration
	// Cut ends the response bodies still streaming from an origin and the
	// tunnels, shortly before Timeout.
	Cut func()
	// HTTP2 drains at the same time as the others; RLS first (health
	// NOT_SERVING at once, then the calls in flight finish), then Public.
	HTTP2, Public func(ctx context.Context) error
	RLS           func(ctx context.Context)
	// Listeners are closed once Public returns.
	Listeners []net.Listener
	// Quiet closes the public connections that have sent nothing for
	// their grace (listen.Quiet.CloseIdle): called every 100 ms while
	// Public drains, as fasthttp checks its idle connections.
	Quiet func() int
	// Tunnels waits for the tunnels, Admin shuts the admin server down.
	Tunnels, Admin func(ctx context.Context) error
}

// Run runs the shutdown; the first error, in the order above with HTTP/2
// last, is returned.
func (s Shutdown) Run() error {
	// A fresh context: the one that asked us to stop is already done.
	sctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	defer cancel()
	// Response bodies still streaming from an origin near the end of the
	// drain (event streams, long downloads) are cut then, so their
	// connections close and the servers stop within the timeout.
	// Tunnels (WebSocket) end then too: fasthttp's shutdown does not
	// wait for hijacked connections, so they are closed within the drain
	// rather than cut when the process exits.
	if s.Cut != nil {
		cut := time.AfterFunc(s.Timeout-streamGrace(s.Timeout), s.Cut)
		defer cut.Stop()
	}
	// The HTTP/2 connections drain at the same time: each server waits
	// for its own.
	h2done := make(chan error, 1)
	if s.HTTP2 != nil {
		go func() { h2done <- s.HTTP2(sctx) }()
	} else {
		h2done <- nil
	}
	if s.RLS != nil {
		s.RLS(sctx)
	}
	if s.Quiet != nil {
		stop := closeQuiet(s.Quiet)
		defer stop()
	}
	err := s.Public(sctx)
	// fasthttp's shutdown closes the listeners its Serve calls had
	// registered; a Serve that had not got that far yet (an edge stopped
	// as soon as it started) would then accept forever. Closing them here
	// ends it too (a listener already closed only returns an error).
	for _, ln := range s.Listeners {
		_ = ln.Close()
	}
	if s.Tunnels != nil {
		// Tunnels are hijacked connections, which the server's shutdown
		// does not wait for: they may finish on their own until the
		// timer above ends them.
		if terr := s.Tunnels(sctx); terr != nil && err == nil {
			err = fmt.Errorf("waiting for tunnels: %w", terr)
		}
	}
	if aerr := s.Admin(sctx); aerr != nil && err == nil {
		err = fmt.Errorf("shutting down the admin server: %w", aerr)
	}
	if herr := <-h2done; herr != nil && err == nil {
		err = fmt.Errorf("shutting down the HTTP/2 server: %w", herr)
	}
	return err
}

// closeQuiet calls quiet every 100 ms until stop is called: a connection
// that has sent nothing holds a drain for its grace at most, not until
// its read timeout.
func closeQuiet(quiet func() int) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			quiet()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-ended }
}

// streamGrace is how long before the end of a drain streamed responses
// are cut: enough for their connections to close and the servers to see
// them gone (fasthttp looks every 100 ms).
func streamGrace(shutdown time.Duration) time.Duration {
	return min(time.Second, shutdown/4)
}
