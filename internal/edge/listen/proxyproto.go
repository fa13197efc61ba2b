package listen

import (
	"bufio"
	"bytes"
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// The PROXY protocol (v1 and v2, haproxy.org's proxy-protocol.txt), from
// the L4 balancers in --proxy-protocol-from only. A connection from a
// balancer must start with a PROXY header, whose source becomes the
// connection's peer address (a socket peer like any other for the trust
// model: trusted only if in --trusted-proxies); a balancer connection
// without one is refused, since it means the balancer is not configured to
// send it. From anyone else a PROXY header is refused and a plain
// connection served as is.
//
// Nothing here reads in Accept: a connection's header is read by its first
// Read, in the goroutine that serves it, so a client that sends nothing
// holds only its own connection. The edge frames the header itself (a
// header may arrive in several segments: the specification recommends
// tolerating it, and go-proxyproto drops a v1 header that does not come in
// one read) and has go-proxyproto parse the Framed bytes.

// maxWaitingHeaders bounds the balancer connections waiting for their
// header at once. A balancer may send the header only with the client's
// first bytes (AWS NLB does), so idle clients can fill the list: the
// oldest waiting is closed to make room, never the newest, and a header
// that comes promptly always finds its place.
const maxWaitingHeaders = 1024

// proxyListener wraps every accepted connection in a proxiedConn.
type proxyListener struct {
	net.Listener
	from    trust.Set
	timeout time.Duration          // for the header
	refused *prometheus.CounterVec // reason
	log     *slog.Logger
	lastLog atomic.Int64 // unix nanos of the last "missing header" warning

	maxWaiting int
	mu         sync.Mutex
	waiting    list.List // of *proxiedConn: balancers' connections without their header yet, oldest first
}

// NewProxyListener puts the PROXY protocol policy over ln: a connection
// from a balancer in from must start with a PROXY header (v1 or v2), read
// within headerTimeout; from anyone else a PROXY header is refused.
// refused counts the refusals by reason.
func NewProxyListener(ln net.Listener, from trust.Set, headerTimeout time.Duration, refused *prometheus.CounterVec, log *slog.Logger) net.Listener {
	return newProxyListener(ln, from, headerTimeout, refused, log)
}

func newProxyListener(ln net.Listener, from trust.Set, headerTimeout time.Duration, refused *prometheus.CounterVec, log *slog.Logger) *proxyListener {
	return &proxyListener{Listener: ln, from: from, timeout: headerTimeout, refused: refused, log: log, maxWaiting: maxWaitingHeaders}
}

func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return trust.Peer(t.IP)
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

// Accept does no I/O: it notes whether the peer is a balancer.
func (l *proxyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pc := &proxiedConn{Conn: c, l: l, balancer: l.from.Contains(addrOf(c.RemoteAddr()))}
	if pc.balancer {
		l.wait(pc)
	}
	return pc, nil
}

// wait lists a balancer's connection among those waiting for a header,
// closing the oldest when the list is full.
func (l *proxyListener) wait(c *proxiedConn) {
	l.mu.Lock()
	var oldest *proxiedConn
	if l.waiting.Len() >= l.maxWaiting {
		oldest = l.waiting.Remove(l.waiting.Front()).(*proxiedConn)
		oldest.waiting = nil
		oldest.evicted.Store(true)
	}
	c.waiting = l.waiting.PushBack(c)
	l.mu.Unlock()
	if oldest != nil {
		l.refused.WithLabelValues("too_many_waiting").Inc()
		_ = oldest.Conn.Close() // its own goroutine sees the error
	}
}

// waited takes c off the waiting list (its header is in, or it is closed).
func (l *proxyListener) waited(c *proxiedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.waiting != nil {
		l.waiting.Remove(c.waiting)
		c.waiting = nil
	}
}

// Why a connection is refused under the policy; a reason each.
var (
	errNoProxyHeader        = errors.New("PROXY protocol: no header from a --proxy-protocol-from balancer")
	errUntrustedProxyHeader = errors.New("PROXY protocol: a header from a peer not in --proxy-protocol-from")
	errInvalidProxyHeader   = errors.New("PROXY protocol: invalid header")
)

// proxiedConn is an accepted connection under the PROXY protocol policy:
// its first Read reads the header (from a balancer) or makes sure there is
// none (from anyone else).
type proxiedConn struct {
	net.Conn // the socket
	l        *proxyListener
	balancer bool
	waiting  *list.Element // in l.waiting, under l.mu
	evicted  atomic.Bool
	deadline atomic.Value // time.Time: the read deadline the server set

	once   sync.Once
	err    error         // the header's, returned by every Read and Write
	failed atomic.Bool   // err is set
	client net.Addr      // the client the balancer's header names
	rest   *bufio.Reader // bytes read past the header; nil once drained
}

// socketAddr is the socket peer (the balancer, for a balancer's connection).
func (c *proxiedConn) socketAddr() net.Addr { return c.Conn.RemoteAddr() }

// RemoteAddr is the client the header names. On a balancer's connection it
// reads the header first: call it only from the connection's goroutine.
func (c *proxiedConn) RemoteAddr() net.Addr {
	if !c.balancer {
		return c.Conn.RemoteAddr()
	}
	c.once.Do(c.readHeader)
	if c.client == nil {
		return c.Conn.RemoteAddr()
	}
	return c.client
}

// header reads the header once and says whether it was refused.
func (c *proxiedConn) header() error {
	c.once.Do(c.readHeader)
	return c.err
}

func (c *proxiedConn) Read(b []byte) (int, error) {
	if err := c.header(); err != nil {
		return 0, err
	}
	if c.rest != nil {
		n, err := c.rest.Read(b)
		if c.rest.Buffered() == 0 {
			c.rest = nil
		}
		return n, err
	}
	return c.Conn.Read(b)
}

// Write does not wait for the header; once the header is refused, nothing
// more is written (the server's error response would reach a peer that
// broke the policy).
func (c *proxiedConn) Write(b []byte) (int, error) {
	if c.failed.Load() {
		return 0, c.err
	}
	return c.Conn.Write(b)
}

func (c *proxiedConn) SetDeadline(t time.Time) error {
	c.deadline.Store(t)
	return c.Conn.SetDeadline(t)
}

func (c *proxiedConn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *proxiedConn) Close() error {
	if c.balancer {
		c.l.waited(c)
	}
	return c.Conn.Close()
}

// NetConn is the socket (ClientGone looks at it).
func (c *proxiedConn) NetConn() net.Conn { return c.Conn }

// readHeader reads the header within the header timeout (or the server's
// earlier read deadline), then puts the server's deadline back.
func (c *proxiedConn) readHeader() {
	if c.balancer {
		defer c.l.waited(c)
	}
	if c.l.timeout > 0 {
		server, _ := c.deadline.Load().(time.Time)
		d := time.Now().Add(c.l.timeout)
		if !server.IsZero() && server.Before(d) {
			d = server
		}
		_ = c.Conn.SetReadDeadline(d)
		defer func() { _ = c.Conn.SetReadDeadline(server) }()
	}
	br := bufio.NewReaderSize(c.Conn, 256)
	var err error
	if c.balancer {
		c.client, err = readProxyHeader(br, c.Conn.RemoteAddr())
	} else if v, perr := signature(br); perr == nil && v != 0 {
		err = errUntrustedProxyHeader
	} // a read error is the first Read's, as without the policy
	if br.Buffered() > 0 {
		c.rest = br
	}
	if err != nil {
		c.err = err
		c.failed.Store(true)
		if !c.evicted.Load() && !errors.Is(err, net.ErrClosed) {
			c.l.refuse(c, err)
		}
	}
}

// signature peeks at the first bytes for a PROXY signature: 1 or 2 for
// the version it starts, 0 for none. It waits for more bytes only while
// those in are the start of a signature.
func signature(br *bufio.Reader) (int, error) {
	for n := 1; ; {
		if _, err := br.Peek(n); err != nil {
			return 0, err
		}
		b, _ := br.Peek(min(br.Buffered(), len(proxyproto.SIGV2)))
		switch {
		case bytes.HasPrefix(b, proxyproto.SIGV1):
			return 1, nil
		case bytes.HasPrefix(b, proxyproto.SIGV2):
			return 2, nil
		case !bytes.HasPrefix(proxyproto.SIGV1, b) && !bytes.HasPrefix(proxyproto.SIGV2, b):
			return 0, nil
		}
		n = len(b) + 1
	}
}

// v1MaxLen is the longest v1 header, CRLF included.
const v1MaxLen = 107

// readProxyHeader reads a whole header from br, however many reads it
// takes, and returns the client it names. A header without an IP client
// (LOCAL, v1 UNKNOWN, v2 AF_UNSPEC or AF_UNIX) names the balancer itself,
// socket: the specification lets a receiver use the real endpoints for an
// unspecified family, and an AF_UNIX path is no address to count or limit
// by.
func readProxyHeader(br *bufio.Reader, socket net.Addr) (net.Addr, error) {
	v, err := signature(br)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", errNoProxyHeader, err)
	case v == 0:
		return nil, errNoProxyHeader
	}
	var raw []byte
	if v == 1 {
		raw, err = frameV1(br)
	} else {
		raw, err = frameV2(br)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidProxyHeader, err)
	}
	if v == 2 && raw[12] == 0x21 && raw[13] == 0x00 {
		// PROXY over AF_UNSPEC: go-proxyproto refuses it; the
		// specification lets the receiver take the real endpoints, as
		// for LOCAL. Its TLVs must still fit.
		if _, err := proxyproto.SplitTLVs(raw[16:]); err != nil {
			return nil, fmt.Errorf("%w: %w", errInvalidProxyHeader, err)
		}
		return socket, nil
	}
	h, err := proxyproto.Read(bufio.NewReaderSize(bytes.NewReader(raw), len(raw)))
	if err == nil {
		_, err = h.TLVs() // go-proxyproto keeps them unchecked
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidProxyHeader, err)
	}
	if h.Command.IsLocal() {
		return socket, nil
	}
	switch a := h.SourceAddr.(type) {
	case *net.TCPAddr:
		return a, nil
	case *net.UDPAddr:
		return &net.TCPAddr{IP: a.IP, Port: a.Port}, nil
	}
	return socket, nil
}

// frameV1 reads a v1 header up to its LF, at most v1MaxLen bytes.
func frameV1(br *bufio.Reader) ([]byte, error) {
	for {
		b, _ := br.Peek(br.Buffered())
		if i := bytes.IndexByte(b[:min(len(b), v1MaxLen)], '\n'); i >= 0 {
			line := bytes.Clone(b[:i+1])
			_, _ = br.Discard(i + 1)
			return line, nil
		}
		if len(b) >= v1MaxLen {
			return nil, proxyproto.ErrVersion1HeaderTooLong
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			return nil, err
		}
	}
}

// frameV2 reads a v2 header: 16 bytes, then as many as they announce (at
// most go-proxyproto's MaxV2HeaderSize, 4 KiB).
func frameV2(br *bufio.Reader) ([]byte, error) {
	b, err := br.Peek(16)
	if err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint16(b[14:16])
	if n > proxyproto.MaxV2HeaderSize {
		return nil, proxyproto.ErrInvalidLength
	}
	raw := make([]byte, 16+int(n))
	if _, err := io.ReadFull(br, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// refuse counts and logs a connection the PROXY policy refused.
func (l *proxyListener) refuse(c *proxiedConn, err error) {
	switch {
	case errors.Is(err, errNoProxyHeader):
		l.refused.WithLabelValues("missing_header").Inc()
		// A misconfigured balancer refuses every connection: say so, at
		// most every 10 s.
		now := time.Now().UnixNano()
		if last := l.lastLog.Load(); now-last > int64(10*time.Second) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Warn("connection from a --proxy-protocol-from balancer without a PROXY header refused: is the balancer configured to send PROXY protocol (v1 or v2)?", "balancer", c.socketAddr().String())
		}
	case errors.Is(err, errUntrustedProxyHeader):
		l.refused.WithLabelValues("untrusted_source").Inc()
		l.log.Debug("PROXY header from a peer not in --proxy-protocol-from refused", "peer", c.socketAddr().String())
	default:
		l.refused.WithLabelValues("invalid_header").Inc()
		l.log.Debug("invalid PROXY header refused", "peer", c.socketAddr().String(), "err", err)
	}
}
