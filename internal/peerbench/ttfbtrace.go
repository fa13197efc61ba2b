package peerbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// Where a request's time to first byte goes inside the edge, read from an
// execution trace of the edge (its admin port's /debug/pprof/trace) while
// clients fetch objects one request at a time on each keep-alive
// connection. For each request a connection's goroutine serves:
//
//   - pre: from the request's arrival (the goroutine woken from its wait
//     on the client's connection, or its read when the bytes were already
//     there) to its write of the request to the origin: the pipeline;
//   - origin: from that write to the edge's last read from the origin
//     before its first write to the client: the origin's answer as the
//     edge sees it, its wake-up included;
//   - post: from that read to the first write to the client: the response
//     header and the first piece of the body. ReadCall is the part of it
//     spent in that read's system call.
//
// The client's own wait for the edge (the edge's wake-up on the request,
// the client's on the answer) is outside the edge's trace: the time to
// first byte the client measures, less the sum of these, is that.

// TTFBPhases are a traced run's requests, each phase in microseconds.
type TTFBPhases struct {
	Pre, Origin, Post, Total []float64
	ReadCall                 []float64 // of Post, the read's system call
	// Fetched is how many requests the clients made while the trace ran
	// (traceEdge): the decomposition leaves out those it cannot follow
	// whole (cut by the trace's start or end).
	Fetched int
}

// ttfbTraceToken is the admin token the traced edge is started with.
const ttfbTraceToken = "peerbench-trace"

// socket I/O the decomposition tells apart.
const (
	ioNone = iota
	clientRead
	clientWrite
	originRead
	originWrite
)

// ioOf says which socket a syscall or a network wait is on, from its stack:
// the origin's connections are the origin package's (its timed connection,
// or the proxy's send flushing the request); the rest is the client's.
func ioOf(st trace.Stack) int {
	var write, read, origin bool
	for f := range st.Frames() {
		switch {
		case f.Func == "syscall.write" || strings.HasSuffix(f.Func, "(*FD).Write"):
			write = true
		case f.Func == "syscall.read" || strings.HasSuffix(f.Func, "(*FD).Read"):
			read = true
		case strings.Contains(f.Func, "/internal/origin.(*timedConn)") || strings.Contains(f.Func, "/internal/origin.(*Proxy).send"):
			origin = true
		}
	}
	switch {
	case write && origin:
		return originWrite
	case read && origin:
		return originRead
	case write:
		return clientWrite
	case read:
		return clientRead
	}
	return ioNone
}

// connState follows one goroutine's requests.
type connState struct {
	served                 bool // a client write since the request began: the next client read starts one
	open                   bool // a request is being followed
	waiting                bool // blocked on the client's connection before the request came
	start, wrote, lastRead time.Duration
	readDone               time.Duration // when lastRead's system call returned
}

// DecomposeTTFB reads an execution trace of the edge and returns its
// requests' phases.
func DecomposeTTFB(r io.Reader) (*TTFBPhases, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	var t0 trace.Time
	conns := map[trace.GoID]*connState{}
	ph := &TTFBPhases{}
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return ph, err
		}
		if t0 == 0 {
			t0 = ev.Time()
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		g := st.Resource.Goroutine()
		c := conns[g]
		if c == nil {
			c = &connState{served: true}
			conns[g] = c
		}
		at := time.Duration(ev.Time() - t0)
		switch {
		case to == trace.GoRunnable && c.waiting:
			c.start, c.waiting = at, false
		case from == trace.GoSyscall && c.lastRead > 0 && c.readDone == 0:
			c.readDone = at
		case from == trace.GoRunning && to == trace.GoWaiting:
			if c.open && c.wrote == 0 && ioOf(ev.Stack()) == clientRead {
				c.waiting = true
			}
		case from == trace.GoRunning && to == trace.GoSyscall:
			switch ioOf(ev.Stack()) {
			case clientRead:
				if c.served {
					*c = connState{open: true, start: at}
				}
			case originWrite:
				if c.open && c.wrote == 0 {
					c.wrote = at
				}
			case originRead:
				if c.open && c.wrote > 0 {
					c.lastRead, c.readDone = at, 0
				}
			case clientWrite:
				if c.open && c.wrote > 0 && c.lastRead > 0 && c.readDone > 0 {
					us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
					ph.Pre = append(ph.Pre, us(c.wrote-c.start))
					ph.Origin = append(ph.Origin, us(c.lastRead-c.wrote))
					ph.Post = append(ph.Post, us(at-c.lastRead))
					ph.ReadCall = append(ph.ReadCall, us(c.readDone-c.lastRead))
					ph.Total = append(ph.Total, us(at-c.start))
				}
				*c = connState{served: true}
			}
		}
	}
	return ph, nil
}

// traceEdge takes an execution trace of the edge for d while clients
// fetch size-byte objects from it, and returns its decomposition.
func traceEdge(ctx context.Context, edge *server, size int64, clients int, d time.Duration) (*TTFBPhases, error) {
	url := fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%d", edge.admin, max(1, int(d/time.Second)))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+ttfbTraceToken)
	type got struct {
		body []byte
		err  error
	}
	done := make(chan got, 1)
	fetched := 0
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- got{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("the edge's trace: %s: %s", resp.Status, b)
		}
		done <- got{b, err}
	}()
	for {
		select {
		case g := <-done:
			if g.err != nil {
				return nil, g.err
			}
			ph, err := DecomposeTTFB(bytes.NewReader(g.body))
			if ph != nil {
				ph.Fetched = fetched
			}
			return ph, err
		default:
		}
		if _, err := load(ctx, edge.addr, size, clients, clients*50); err != nil {
			return nil, err
		}
		fetched += clients * 50
	}
}

// traceArgs are the edge's flags for traceEdge: the profiler, and the
// admin token it needs, in a file in dir.
func traceArgs(dir string) ([]string, error) {
	f := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(f, []byte(ttfbTraceToken+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []string{"--pprof", "--admin-token-file", f}, nil
}

// printPhases prints a traced run's phases.
func printPhases(w io.Writer, ph *TTFBPhases) {
	fmt.Fprintf(w, "\n# inside the edge, from an execution trace: %d requests of the about %d fetched while it ran (the tracer's own cost in them), µs\n", len(ph.Total), ph.Fetched)
	fmt.Fprintf(w, "%-52s %8s %8s %8s\n", "phase", "p50", "p90", "p99")
	for _, row := range []struct {
		name string
		v    []float64
	}{
		{"pre: arrival to the request's write to the origin", ph.Pre},
		{"origin: that write to the last read of its answer", ph.Origin},
		{"post: that read to the first byte written", ph.Post},
		{"… of it, that read's system call", ph.ReadCall},
		{"total", ph.Total},
	} {
		if len(row.v) == 0 {
			fmt.Fprintf(w, "%-52s %8s %8s %8s\n", row.name, "-", "-", "-")
			continue
		}
		s := slices.Clone(row.v)
		slices.Sort(s)
		fmt.Fprintf(w, "%-52s %8.1f %8.1f %8.1f\n", row.name, quantile(s, 0.5), quantile(s, 0.9), quantile(s, 0.99))
	}
}
