package peerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SlowConfig is a run of SlowReaders.
type SlowConfig struct {
	EdgeBin, NginxBin string // NginxBin empty: the edge only
	Clients           int
	Rate              int64         // bytes per second each client reads
	Hold              time.Duration // how long the streams run before memory is read
	ObjectSize        int64
	RcvBuf            int           // the clients' SO_RCVBUF, set before connecting
	EdgeArgs          []string      // more flags for the edge
	Ramp              time.Duration // the clients start evenly over it
	Out               io.Writer
}

// DefaultSlowConfig is the measurement make bench-slow-readers runs.
func DefaultSlowConfig() SlowConfig {
	return SlowConfig{Clients: 1000, Rate: 64 << 10, Hold: 60 * time.Second, ObjectSize: 1 << 30, RcvBuf: 16 << 10, Ramp: 5 * time.Second, Out: os.Stdout}
}

// SlowResult is one proxy's figures.
type SlowResult struct {
	Proxy            string
	IdleKiB, LoadKiB int64 // resident memory before the clients and after Hold
	PeakKiB          int64 // VmHWM at the end
	Goroutines       int   // the edge's go_goroutines under load (-1: not read)
	Open             int   // streams still open (no error) when memory was read
	Bytes            int64 // bytes the clients read, each checked
	FirstError       string
	LoadAvg          string // the machine's load average when memory was read
	// TCPKiB is what the machine's TCP sockets grew by (/proc/net/sockstat):
	// mostly the proxy's send buffers, which are no part of its RSS.
	TCPKiB                 int64
	PerStreamKiB           float64
	MeanRateBytesPerSecond float64
}

// SlowReaders runs cfg.Clients clients against the edge (and nginx, if
// given, afterwards), each reading a large object at cfg.Rate over a
// socket with a small receive buffer, and reads the proxy's resident memory
// after cfg.Hold.
func SlowReaders(ctx context.Context, cfg SlowConfig) ([]SlowResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "peerbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	origin, err := startOrigin(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer origin.stop()
	fmt.Fprintf(cfg.Out, "# %d clients started over %s, each reading a %s object at %s/s, SO_RCVBUF %d (the kernel doubles it), memory read %s after the last header\n",
		cfg.Clients, cfg.Ramp, size(cfg.ObjectSize), size(cfg.Rate), cfg.RcvBuf, cfg.Hold)
	var out []SlowResult
	for _, name := range []string{"edge", "nginx"} {
		var s *server
		switch {
		case name == "edge":
			// Every stream holds an origin connection: room for all of them.
			s, err = startEdge(ctx, cfg.EdgeBin, dir, origin.addr,
				append([]string{"--origin-max-conns", strconv.Itoa(cfg.Clients + 64)}, cfg.EdgeArgs...)...)
		case cfg.NginxBin != "":
			// No temporary files: by default nginx would spool up to
			// 1 GiB of each response to disk ahead of a slow client.
			s, err = startNginx(ctx, cfg.NginxBin, dir, origin.addr, "0")
		default:
			continue
		}
		if err != nil {
			return out, err
		}
		r, err := slowRun(ctx, s, cfg)
		s.stop()
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, r)
		fmt.Fprintf(cfg.Out, "%-6s idle %d KiB, under load %d KiB, peak %d KiB: %.1f KiB per stream; %d of %d streams open, mean %.1f KiB/s each; goroutines %d; load average %s\n",
			name, r.IdleKiB, r.LoadKiB, r.PeakKiB, r.PerStreamKiB, r.Open, cfg.Clients, r.MeanRateBytesPerSecond/1024, r.Goroutines, r.LoadAvg)
		fmt.Fprintf(cfg.Out, "%-6s kernel TCP memory grew by %d KiB, %.1f KiB per stream (both hops, the whole machine; no part of the RSS above)\n",
			name, r.TCPKiB, float64(r.TCPKiB)/float64(cfg.Clients))
		if r.FirstError != "" {
			fmt.Fprintf(cfg.Out, "%-6s %s\n", name, r.FirstError)
		}
	}
	var failed []string
	for _, r := range out {
		if r.Open < cfg.Clients {
			failed = append(failed, fmt.Sprintf("%s: %d of %d streams ended early", r.Proxy, cfg.Clients-r.Open, cfg.Clients))
		}
	}
	if failed != nil {
		return out, errors.New(strings.Join(failed, "; "))
	}
	return out, nil
}

func slowRun(ctx context.Context, s *server, cfg SlowConfig) (SlowResult, error) {
	r := SlowResult{Proxy: s.name, Goroutines: -1, IdleKiB: memKiB(s.pid(), "VmRSS")}
	tcp0 := tcpMemKiB()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		started, wg sync.WaitGroup
		bytesRead   atomic.Int64
		failed      atomic.Int64
		firstErr    atomic.Pointer[error]
	)
	started.Add(cfg.Clients)
	t0 := time.Now()
	// The clients start one every Ramp/Clients, not all at once: a
	// thousand requests in the same instant measure the machine's accept
	// queue and the origin's header time on two busy cores, not streaming.
	var tick <-chan time.Time
	if cfg.Ramp > 0 && cfg.Clients > 1 {
		t := time.NewTicker(cfg.Ramp / time.Duration(cfg.Clients))
		defer t.Stop()
		tick = t.C
	}
	for i := range cfg.Clients {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				started.Add(i - cfg.Clients) // the ones never started
				wg.Wait()
				return r, ctx.Err()
			}
		}
		wg.Go(func() {
			err := slowClient(ctx, s.addr, cfg, &started, &bytesRead)
			if err != nil && ctx.Err() == nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		})
	}
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(cfg.Ramp + 30*time.Second):
		cancel()
		wg.Wait()
		return r, errors.New("not every client got a response header in time")
	}
	hold := time.NewTimer(cfg.Hold)
	select {
	case <-hold.C:
	case <-ctx.Done():
		return r, ctx.Err()
	}
	r.LoadKiB = memKiB(s.pid(), "VmRSS")
	r.LoadAvg = loadavg()
	r.TCPKiB = tcpMemKiB() - tcp0
	r.PeakKiB = memKiB(s.pid(), "VmHWM")
	if s.admin != "" {
		r.Goroutines = goroutines(ctx, s.admin)
	}
	r.Open = cfg.Clients - int(failed.Load())
	elapsed := time.Since(t0)
	r.Bytes = bytesRead.Load()
	cancel()
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		r.FirstError = fmt.Sprintf("%d clients failed, the first: %v", failed.Load(), *p)
		if s.admin != "" {
			r.FirstError += "\nthe edge's stream metrics:\n" + metricLines(context.Background(), s.admin, "edgeguard_origin_") +
				"its log ends:\n" + s.logTail()
		}
	}
	r.PerStreamKiB = float64(r.LoadKiB-r.IdleKiB) / float64(cfg.Clients)
	r.MeanRateBytesPerSecond = float64(r.Bytes) / elapsed.Seconds() / float64(cfg.Clients)
	return r, nil
}

// slowClient reads an object through addr at cfg.Rate until ctx ends or
// the object does, checking its bytes.
func slowClient(ctx context.Context, addr string, cfg SlowConfig, started *sync.WaitGroup, total *atomic.Int64) error {
	once := sync.OnceFunc(started.Done)
	defer once()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, cfg.RcvBuf)
		})
		return errors.Join(err, serr)
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/obj/"+strconv.FormatInt(cfg.ObjectSize, 10), nil)
	if err := req.Write(conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 4<<10), req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	once()
	// The reads follow the object stream, so every byte is checked.
	want := newObjectStream()
	wantBuf := make([]byte, chunk)
	wantLeft := 0
	buf := make([]byte, 16<<10)
	var got int64
	t0 := time.Now()
	for {
		n, err := resp.Body.Read(buf)
		for b := buf[:n]; len(b) > 0; {
			if wantLeft == 0 {
				want.fill(wantBuf)
				wantLeft = len(wantBuf)
			}
			k := min(len(b), wantLeft)
			off := len(wantBuf) - wantLeft
			if string(b[:k]) != string(wantBuf[off:off+k]) {
				return fmt.Errorf("bytes from %d differ from the object's", got)
			}
			b, wantLeft, got = b[k:], wantLeft-k, got+int64(k)
		}
		total.Add(int64(n))
		if err == io.EOF {
			if got != cfg.ObjectSize {
				return fmt.Errorf("%d bytes, want %d", got, cfg.ObjectSize)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("after %d bytes, %.1f s: %w", got, time.Since(t0).Seconds(), err)
		}
		// Pace: byte got is due at t0 + got/Rate.
		if wait := time.Until(t0.Add(time.Duration(float64(got) / float64(cfg.Rate) * float64(time.Second)))); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
	}
}
