package origin

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// smallBody is the largest declared body Serve reads whole before it
// returns, as a plain body: what a small response costs stays what it was
// when every body was buffered, and its connection goes back to the pool
// at once. Larger bodies, and bodies of unknown length, stream.
const smallBody = 64 << 10

// copyBuf is how much of a streamed body is in the edge at once (besides
// the origin connection's read buffer and the client connection's write
// buffer): a client that stops taking bytes stops the reads, and the
// origin's own writes then block. Pooled: a stream holds one only while it
// copies.
const copyBuf = 32 << 10

var copyBufs = sync.Pool{New: func() any { return new([copyBuf]byte) }}

// streamEnd is how a streamed body ended (the streams_total label).
type streamEnd int

const (
	endComplete    streamEnd = iota
	endOrigin                // the origin broke off (or sent a bad chunk)
	endClient                // the client connection failed
	endReadIdle              // the origin sent nothing for ReadIdleTimeout
	endTotal                 // Timeout passed
	endClientWrite           // the client took nothing for the server's write timeout
	endShutdown              // EndStreams
	endUnsent                // closed before its copy began (the client went away first)
	numStreamEnds
)

var streamEndNames = [numStreamEnds]string{"complete", "origin_error", "client_error", "read_idle_timeout", "total_timeout", "client_write_timeout", "shutdown", "unsent"}

func (e streamEnd) String() string { return streamEndNames[e] }

// responseBody is an origin response body on its way to the client, the
// server's body stream: fasthttp (or the HTTP/2 server) calls WriteTo,
// which copies each read as it arrives and flushes it, then Close, which
// gives the connection back (or closes it, if the body did not end) and
// the exchange to its pool. It lives in the exchange: streaming costs no
// allocation of its own.
type responseBody struct {
	p      *Proxy
	ex     *exchange
	src    io.Reader
	conn   *timedConn
	o      *origin
	id     string
	atEnd  func() // Hop.AtEnd
	copied bool
	end    streamEnd
	err    error
}

// SupportsBodyWriteTo tells fasthttp to hand WriteTo its writer rather
// than copy through a buffer of its own.
func (b *responseBody) SupportsBodyWriteTo() bool { return true }

// flusher is the server's buffered writer (fixed-length bodies) or the
// HTTP/2 body writer; a chunked body's writer flushes every chunk itself.
type flusher interface{ Flush() error }

// WriteTo copies the body to w a read at a time, each read flushed to the
// client as it comes (server-sent events, long polls), so at most copyBuf
// bytes of it are in the edge and a client that does not read stops the
// origin.
func (b *responseBody) WriteTo(w io.Writer) (int64, error) {
	b.copied = true
	buf := copyBufs.Get().(*[copyBuf]byte)
	defer copyBufs.Put(buf)
	f, _ := w.(flusher)
	// Nothing of the body came with the origin's header: the client gets
	// the header now rather than with the body's first bytes, which may
	// be long in coming. Over HTTP/2 this flush sends it; HTTP/1.1's
	// server has sent it already (ImmediateHeaderFlush) and this flush
	// finds nothing to write.
	if f != nil && b.ex.br != nil && b.ex.br.Buffered() == 0 {
		if err := f.Flush(); err != nil {
			b.end, b.err = endClient, err
			if isTimeout(err) {
				b.end = endClientWrite
			}
			return 0, err
		}
	}
	var n int64
	for {
		k, rerr := b.src.Read(buf[:])
		if k > 0 {
			m, werr := w.Write(buf[:k])
			n += int64(m)
			if werr == nil && f != nil {
				werr = f.Flush()
			}
			if werr != nil {
				b.end, b.err = endClient, werr
				if isTimeout(werr) {
					b.end = endClientWrite
				}
				return n, werr
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			b.end = endComplete
			return n, nil
		default:
			b.end, b.err = b.readEnd(rerr), rerr
			return n, rerr
		}
	}
}

// Read serves a writer that does not use WriteTo.
func (b *responseBody) Read(p []byte) (int, error) {
	b.copied = true
	n, err := b.src.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.end = endComplete
	default:
		b.end, b.err = b.readEnd(err), err
	}
	return n, err
}

// readEnd says why reading the origin's body failed.
func (b *responseBody) readEnd(err error) streamEnd {
	switch {
	case b.conn != nil && b.conn.ending.Load(), errors.Is(err, errStreamEnded):
		return endShutdown
	case !isTimeout(err):
		return endOrigin
	case b.conn != nil && !b.conn.until.IsZero() && !time.Now().Before(b.conn.until):
		return endTotal
	default:
		return endReadIdle
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// Close ends the stream (fasthttp calls it once the body is written, or
// when the response is dropped unwritten): the metrics and the log learn
// how it ended, the origin connection goes back to its pool if the body
// was read to its end (else it is closed), and the exchange to its pool.
func (b *responseBody) Close() error {
	p, ex := b.p, b.ex
	p.unregister(b.conn)
	if !b.copied {
		b.end = endUnsent
	}
	p.metrics.streams[b.end].Inc()
	switch b.end {
	case endReadIdle:
		p.metrics.timeouts[phaseReadIdle].Inc()
	case endTotal:
		p.metrics.timeouts[phaseTotal].Inc()
	case endClientWrite:
		p.metrics.timeouts[phaseClientWrite].Inc()
	}
	if b.end != endComplete && b.end != endUnsent {
		p.logStream(b.o, b.end, b.err, b.id)
	}
	// A body read to its end gives the connection back; any other
	// closes it.
	ex.finish(b.o, b.end == endComplete)
	atEnd := b.atEnd
	*b = responseBody{}
	ex.release()
	if atEnd != nil {
		atEnd()
	}
	return nil
}
