package peerbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// newClient is a keep-alive client with one idle connection per worker.
func newClient(workers int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: workers,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
	}}
}

// fetch GETs an object of size bytes from addr and reads it whole, checking
// its length and, for an object of up to patternSize, every byte. It
// returns the time from the request written to the first body byte read.
func fetch(ctx context.Context, c *http.Client, addr string, size int64, buf []byte) (time.Duration, error) {
	var wrote time.Time
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote = time.Now() }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet,
		"http://"+addr+"/obj/"+strconv.FormatInt(size, 10), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: status %d", req.URL, resp.StatusCode)
	}
	var ttfb time.Duration
	var got int64
	want := pattern()
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if got == 0 {
				ttfb = time.Since(wrote)
			}
			if size <= patternSize && (got+int64(n) > size || !bytes.Equal(buf[:n], want[got:got+int64(n)])) {
				return 0, fmt.Errorf("GET %s: bytes %d–%d differ from the object's", req.URL, got, got+int64(n))
			}
			got += int64(n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("GET %s: after %d bytes: %w", req.URL, got, err)
		}
	}
	if got != size {
		return 0, fmt.Errorf("GET %s: %d bytes, want %d", req.URL, got, size)
	}
	if size == 0 {
		ttfb = time.Since(wrote)
	}
	return ttfb, nil
}

// load runs requests GETs of size bytes from addr over workers keep-alive
// connections and returns every request's time to first byte.
func load(ctx context.Context, addr string, size int64, workers, requests int) ([]time.Duration, error) {
	c := newClient(workers)
	defer c.CloseIdleConnections()
	ttfbs := make([]time.Duration, requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			buf := make([]byte, 64<<10)
			for {
				i := next.Add(1) - 1
				if i >= int64(requests) {
					return
				}
				d, err := fetch(ctx, c, addr, size, buf)
				if err != nil {
					errs <- err
					next.Store(int64(requests)) // the others stop too
					return
				}
				ttfbs[i] = d
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
		return ttfbs, nil
	}
}
