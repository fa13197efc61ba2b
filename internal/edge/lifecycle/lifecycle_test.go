package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/handoff"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// recorder notes the hooks called, in order.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// The shutdown runs its steps in order — the rate limit service before
// the public server, the listeners closed after it, then the tunnels and
// the admin server — with HTTP/2 draining alongside (it is let finish only
// once the admin server was shut down), and the first error in that order
// is the one returned, wrapped with what failed.
func TestShutdownOrderAndFirstError(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name                       string
		public, tunnels, admin, h2 error
		want                       string
	}{
		{name: "none"},
		{name: "public first", public: boom, tunnels: boom, admin: boom, h2: boom, want: "boom"},
		{name: "tunnels", tunnels: boom, admin: boom, h2: boom, want: "waiting for tunnels: boom"},
		{name: "admin", admin: boom, h2: boom, want: "shutting down the admin server: boom"},
		{name: "HTTP/2 last", h2: boom, want: "shutting down the HTTP/2 server: boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			adminDone := make(chan struct{})
			step := func(name string, err error) func(context.Context) error {
				return func(context.Context) error {
					r.note(name)
					return err
				}
			}
			err = Shutdown{
				Timeout: 10 * time.Second,
				HTTP2: func(ctx context.Context) error {
					select {
					case <-adminDone:
					case <-ctx.Done():
						return ctx.Err()
					}
					r.note("h2")
					return tc.h2
				},
				RLS:       func(context.Context) { r.note("rls") },
				Public:    step("public", tc.public),
				Listeners: []net.Listener{ln},
				Tunnels: func(ctx context.Context) error {
					_, aerr := ln.Accept()
					require.Error(t, aerr, "the listener is closed before the tunnels are waited for")
					r.note("tunnels")
					return tc.tunnels
				},
				Admin: func(context.Context) error {
					r.note("admin")
					close(adminDone)
					return tc.admin
				},
			}.Run()
			require.Equal(t, []string{"rls", "public", "tunnels", "admin", "h2"}, r.seen())
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.want)
			require.ErrorIs(t, err, boom)
		})
	}
}

// Streams still open near the end of the drain are cut before the
// shutdown timeout, so a server waiting for them returns within it: the
// public server's shutdown here ends because Cut ran, not because its
// context expired.
func TestShutdownCutsStreamsBeforeTheTimeout(t *testing.T) {
	cut := make(chan struct{})
	var why string
	err := Shutdown{
		Timeout: 2 * time.Second,
		Cut:     func() { close(cut) },
		Public: func(ctx context.Context) error {
			select {
			case <-cut:
				why = "cut"
				return nil
			case <-ctx.Done():
				why = "timeout"
				return ctx.Err()
			}
		},
		Admin: func(context.Context) error { return nil },
	}.Run()
	require.NoError(t, err)
	require.Equal(t, "cut", why)
	require.Equal(t, time.Second, streamGrace(time.Minute))
	require.Equal(t, 250*time.Millisecond, streamGrace(time.Second))
}

// catalog is a fake service catalog.
type catalog struct {
	r       *recorder
	running chan struct{}
}

func (c *catalog) Run(ctx context.Context) {
	c.r.note("catalog run")
	close(c.running)
	<-ctx.Done()
	c.r.note("catalog stopped")
}

func (c *catalog) Deregister() { c.r.note("catalog deregistered") }

// testPlan is a plan whose public server serves until its shutdown, with
// a catalog and a background task, each recording what happens to it.
func testPlan(r *recorder) (Plan, chan struct{}) {
	serving := make(chan struct{})
	stopPublic := make(chan struct{})
	var once sync.Once
	return Plan{
		Background: []func(context.Context){func(ctx context.Context) { <-ctx.Done(); r.note("background stopped") }},
		Servers: []Server{{Name: "public server", Serve: func() error {
			<-stopPublic
			return nil
		}}},
		Catalog: &catalog{r: r, running: make(chan struct{})},
		Reopen:  func() error { r.note("reopen"); return nil },
		Reload:  func() { r.note("reload") },
		Sockets: handoff.NewSockets(nil, slog.New(slog.DiscardHandler)),
		Serving: func() { close(serving) },
		Ready:   func() bool { return true },
		Drain:   func() { r.note("drain") },
		Shutdown: Shutdown{
			Timeout: 10 * time.Second,
			Public: func(context.Context) error {
				once.Do(func() { close(stopPublic) })
				r.note("shutdown")
				return nil
			},
			Admin: func(context.Context) error { return nil },
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, serving
}

// A server that fails shuts the edge down at once: no drain delay (an hour
// here), the edge marked draining and deregistered first, the error
// returned with the server's name; the background tasks run until Run
// returns.
func TestRunStopsWhenAServerFails(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	var r recorder
	p, _ := testPlan(&r)
	p.DrainDelay = time.Hour
	running := p.Catalog.(*catalog).running
	p.Servers = append(p.Servers, Server{Name: "admin server", Serve: func() error {
		<-running
		return errors.New("boom")
	}})
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), p) }()
	select {
	case err := <-done:
		require.EqualError(t, err, "admin server: boom")
	case <-testenv.Within(t, 30*time.Second).Done():
		t.Fatal("Run did not return after a server failed")
	}
	require.Equal(t, []string{"catalog run", "drain", "catalog stopped", "catalog deregistered", "shutdown", "background stopped"}, r.seen())
}

// SIGHUP reopens the access log and re-reads the files; SIGUSR1 only
// reopens the log. Cancelling the context then drains and stops.
func TestRunReloadsOnSignals(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	var r recorder
	p, serving := testPlan(&r)
	reloaded := make(chan struct{}, 2)
	p.Reload = func() { r.note("reload"); reloaded <- struct{}{} }
	reopened := make(chan struct{}, 2)
	p.Reopen = func() error { r.note("reopen"); reopened <- struct{}{}; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, p) }()
	within := testenv.Within(t, 30*time.Second)
	wait := func(c <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-within.Done():
			t.Fatalf("%s: not seen", what)
		}
	}
	wait(serving, "serving") // the signals are caught from here
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGUSR1))
	wait(reopened, "SIGUSR1's reopen")
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGHUP))
	wait(reloaded, "SIGHUP's reload")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-within.Done():
		t.Fatal("Run did not return after its context ended")
	}
	var signalled []string
	for _, c := range r.seen() {
		if c == "reopen" || c == "reload" {
			signalled = append(signalled, c)
		}
	}
	require.Equal(t, []string{"reopen", "reopen", "reload"}, signalled, r.seen())
	require.Contains(t, r.seen(), "catalog deregistered")
}
