package peerbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// BigConfig is a run of BigObject.
type BigConfig struct {
	EdgeBin string
	Size    int64
	Out     io.Writer
}

// BigResult is what BigObject saw.
type BigResult struct {
	Bytes             int64
	ClientSum, Origin string // SHA-256 of what the client read and of what the origin wrote
	Elapsed           time.Duration
	EdgePeakKiB       int64 // the edge's VmHWM at the end
	EdgeIdleKiB       int64 // its VmRSS before the transfer
}

// BigObject fetches one object of cfg.Size through the edge, hashing it as
// it arrives, and compares the hash with the one the origin computed of
// what it wrote.
func BigObject(ctx context.Context, cfg BigConfig) (*BigResult, error) {
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
	edge, err := startEdge(ctx, cfg.EdgeBin, dir, origin.addr)
	if err != nil {
		return nil, err
	}
	defer edge.stop()

	r := &BigResult{EdgeIdleKiB: memKiB(edge.pid(), "VmRSS")}
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		"http://"+edge.addr+"/obj/"+strconv.FormatInt(cfg.Size, 10)+"?sum="+id, nil)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	h := sha256.New()
	r.Bytes, err = io.CopyBuffer(h, resp.Body, make([]byte, 256<<10))
	r.Elapsed = time.Since(t0)
	if err != nil {
		return r, fmt.Errorf("after %d bytes: %w", r.Bytes, err)
	}
	r.ClientSum = hex.EncodeToString(h.Sum(nil))
	r.EdgePeakKiB = memKiB(edge.pid(), "VmHWM")

	// The origin stores its sum once its last write returned, which can be
	// just after the client read the last byte.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = proc.PollEvery(wctx, 10*time.Millisecond, "the origin's sum", func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+origin.addr+"/sum/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}
		r.Origin = string(b)
		return nil
	})
	if err != nil {
		return r, err
	}
	fmt.Fprintf(cfg.Out, "%s through the edge in %.1f s (%.0f MiB/s); sha256 client %s, origin %s; edge RSS idle %d KiB, peak %d KiB; load average %s\n",
		size(r.Bytes), r.Elapsed.Seconds(), float64(r.Bytes)/(1<<20)/r.Elapsed.Seconds(), r.ClientSum, r.Origin, r.EdgeIdleKiB, r.EdgePeakKiB, loadavg())
	if r.Bytes != cfg.Size {
		return r, fmt.Errorf("read %d bytes, want %d", r.Bytes, cfg.Size)
	}
	if r.ClientSum != r.Origin {
		return r, errors.New("the client's hash differs from the origin's")
	}
	return r, nil
}
