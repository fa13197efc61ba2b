package origin

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

// The exchange with an origin is ours rather than HostClient.Do's: Do
// either reads a body whole or, with StreamResponseBody, streams every
// body, small ones too, at four allocations of its own per response (a
// stream wrapper and three closures) before the length is known. Here the
// header is read first, then the body is read whole when it is small and
// declared, or left streaming on the connection, which the exchange keeps
// until the stream is closed. The HostClient still owns the connections:
// the pool, the dialer (ours, with its timeouts), MaxConns, idle cleanup.

// maxAttempts bounds the sends of one idempotent request whose pooled
// connection turned out closed (fasthttp's DefaultMaxIdemponentCallAttempts).
const maxAttempts = 5

// connPool is what an exchange needs of an origin's HostClient that
// fasthttp types with its unexported connection type: putting a
// connection back.
type connPool interface {
	// put gives cc (a connection AcquireConn returned) back to the pool,
	// or closes it when discard is true.
	put(cc any, discard bool)
}

// hostConns is connPool for the HostClient whose methods it holds; C is
// fasthttp's connection type, inferred from them.
type hostConns[C any] struct {
	release, close func(C)
}

func newHostConns[C any](release, close func(C)) hostConns[C] {
	return hostConns[C]{release: release, close: close}
}

func (h hostConns[C]) put(cc any, discard bool) {
	c := cc.(C)
	if discard {
		h.close(c)
		return
	}
	h.release(c)
}

// put gives a connection back to o's pool, or closes it when discard is
// true or the pool is closed: a stream ending after Close must not leave
// an idle connection behind.
func (o *origin) put(cc any, discard bool) {
	o.conns.put(cc, discard || o.closed.Load())
}

// roundTrip sends ex.req to o and reads the response header into ex.resp,
// and a small body (up to smallBody, declared) into ex.small; a larger body
// is left streaming (ex.resp's body stream), its connection and reader in
// the exchange until finish. The header phase ends at deadline; from then
// on each read of the body has ReadIdleTimeout, up to until. An idempotent
// request without a streamed body is sent again when its pooled connection
// turns out closed.
//
// whole asks for a body of unknown length to be read whole (up to
// maxWholeBody): an HTTP/1.0 client cannot take it chunked.
func (p *Proxy) roundTrip(o *origin, ex *exchange, deadline, until time.Time, whole bool) error {
	o.pending.Add(1)
	defer o.pending.Add(-1)
	req := &ex.req
	streamed := req.IsBodyStream() // writing the request consumes it
	idempotent := req.Header.IsGet() || req.Header.IsHead() || req.Header.IsPut() || req.Header.IsQuery()
	for attempt := 1; ; attempt++ {
		if !time.Now().Before(deadline) {
			return fasthttp.ErrTimeout
		}
		retry, err := p.send(o, ex, deadline, until, whole)
		if err == nil || !retry || streamed || !idempotent || attempt >= maxAttempts {
			if errors.Is(err, io.EOF) {
				err = fasthttp.ErrConnectionClosed
			}
			return err
		}
	}
}

// send is one attempt of roundTrip; retry says the request may be sent
// again (nothing of an answer was read).
func (p *Proxy) send(o *origin, ex *exchange, deadline, until time.Time, whole bool) (retry bool, err error) {
	req, resp := &ex.req, &ex.resp
	resp.Reset()
	cc, err := o.client.AcquireConn(time.Until(deadline), req.ConnectionClose())
	if err != nil {
		return false, err // a failed dial (dialError), or no free connection
	}
	conn := cc.Conn()
	tc := timedOf(conn)
	req.URI().DisablePathNormalizing = true

	if err := conn.SetWriteDeadline(deadline); err != nil {
		o.put(cc, true)
		return true, err
	}
	bw := o.client.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	o.client.ReleaseWriter(bw)
	if err != nil {
		o.put(cc, true)
		if isTimeout(err) {
			err = fasthttp.ErrTimeout
		}
		return true, err
	}

	if err := conn.SetReadDeadline(deadline); err != nil { // the header phase
		o.put(cc, true)
		return true, err
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	resp.StreamBody = true // the body is read below, or streams
	br := o.client.AcquireReader(conn)
	if err := resp.ReadLimitBody(br, 0); err != nil {
		resp.Reset()
		o.client.ReleaseReader(br)
		o.put(cc, true)
		return true, err
	}
	closeConn := req.ConnectionClose() || resp.ConnectionClose()
	if !resp.IsBodyStream() { // no body (HEAD, 204, 304)
		ex.kind = bodyNone
		o.client.ReleaseReader(br)
		o.put(cc, closeConn)
		return false, nil
	}
	if tc != nil {
		tc.streamBody(until)
	}
	n := resp.Header.ContentLength()
	if n < 0 && whole {
		ex.kind = bodySmall
		ex.small, err = readWhole(resp.BodyStream(), ex.small[:0], maxWholeBody)
		_ = resp.CloseBodyStream() // it reads from br
		o.client.ReleaseReader(br)
		o.put(cc, closeConn || err != nil)
		if err != nil {
			return false, fmt.Errorf("reading the response body: %w", err)
		}
		return false, nil
	}
	if n < 0 || n > smallBody {
		ex.kind = bodyStream
		ex.cc, ex.br, ex.conn, ex.closeConn = cc, br, tc, closeConn
		return false, nil
	}
	if cap(ex.small) < n {
		ex.small = make([]byte, n)
	}
	ex.kind = bodySmall
	ex.small = ex.small[:n]
	_, err = io.ReadFull(resp.BodyStream(), ex.small)
	_ = resp.CloseBodyStream() // it reads from br
	o.client.ReleaseReader(br)
	o.put(cc, closeConn || err != nil)
	if err != nil {
		return false, fmt.Errorf("reading the response body: %w", err)
	}
	return false, nil
}

// maxWholeBody bounds a body of unknown length read whole for an HTTP/1.0
// client (the cap every response had before responses streamed); a larger
// one is answered 502.
const maxWholeBody = 64 << 20

// readWhole appends r to dst up to limit bytes (fasthttp.ErrBodyTooLarge
// past it).
func readWhole(r io.Reader, dst []byte, limit int) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):min(cap(dst), limit+1)])
		dst = dst[:len(dst)+n]
		switch {
		case len(dst) > limit:
			return dst[:0], fasthttp.ErrBodyTooLarge
		case errors.Is(err, io.EOF):
			return dst, nil
		case err != nil:
			return dst, err
		}
	}
}

// finish gives back what a streamed body held: the connection goes back
// to its pool when the body was read to its end, else it is closed.
func (ex *exchange) finish(o *origin, complete bool) {
	ex.resp.Reset() // releases fasthttp's body stream, which reads from br
	if ex.br != nil {
		o.client.ReleaseReader(ex.br)
	}
	if ex.cc != nil {
		o.put(ex.cc, ex.closeConn || !complete)
	}
	ex.cc, ex.br, ex.conn, ex.closeConn = nil, nil, nil, false
}
