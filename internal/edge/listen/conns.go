package listen

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// connCap caps the connections one client may hold open, counted by socket
// peer (X-Forwarded-For is not known at accept): an IPv4 address, or an
// IPv6 client's --ipv6-prefix network. Trusted proxies are not Capped: each
// carries many clients. fasthttp's Server.MaxConnsPerIP would do the
// counting but skips IPv6 peers and races with Server.Shutdown (its
// pooled conn wrapper is cleared on Close while the serving goroutine
// still reads through it), so the edge counts at its listener.
type connCap struct {
	net.Listener
	*ConnCounts
	// refusal is written to a refused connection; nil under TLS, where
	// plain text would be garbage to the client.
	refusal []byte
	// writing bounds the refusals being written at once.
	writing chan struct{}
}

// maxRefusalWriters bounds the goroutines writing refusals; past it a
// refused connection is closed without one.
const maxRefusalWriters = 64

// ConnCounts are the open connections by client, shared by the public
// listeners (plain and TLS): a client's share is for both together.
type ConnCounts struct {
	max     int
	v6Bits  int
	trusted trust.Set
	refused prometheus.Counter

	mu   sync.Mutex
	open map[netip.Addr]int
}

// NewConnCounts caps each client address (an IPv6 client's v6Bits
// network) at max connections (0: no cap), trusted peers exempt; refused
// counts the connections closed at the cap.
func NewConnCounts(max, v6Bits int, trusted trust.Set, refused prometheus.Counter) *ConnCounts {
	return &ConnCounts{max: max, v6Bits: v6Bits, trusted: trusted, refused: refused, open: map[netip.Addr]int{}}
}

// Capped caps ln's connections per client address unless the cap is 0.
func Capped(ln net.Listener, counts *ConnCounts, refusal []byte) net.Listener {
	if counts.max <= 0 {
		return ln
	}
	return &connCap{Listener: ln, ConnCounts: counts, refusal: refusal, writing: make(chan struct{}, maxRefusalWriters)}
}

// TooManyConns is written to a refused connection before it is closed.
const TooManyConns = "HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 38\r\nRetry-After: 1\r\n\r\ntoo many connections from your address"

// errTooManyConns ends a connection refused once its PROXY header named a
// client that already holds its share.
var errTooManyConns = errors.New("too many connections from this client address")

// Accept does no I/O for any one connection: a client is counted by its
// socket address, known at accept, or (through a balancer) once its
// PROXY header is read, in the connection's own goroutine; a refusal is
// written in a goroutine of its own.
func (l *connCap) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if pc, ok := c.(*proxiedConn); ok && pc.balancer {
			return &lateCappedConn{proxiedConn: pc, l: l}, nil
		}
		key, counted, ok := l.admit(c.RemoteAddr())
		if !ok {
			l.refuse(c)
			continue
		}
		if !counted {
			return c, nil
		}
		return &cappedConn{Conn: c, l: l, key: key}, nil
	}
}

// admit takes a slot for addr's client: counted is false for a trusted
// proxy (or an address that does not parse), ok false when it is full.
func (l *ConnCounts) admit(addr net.Addr) (key netip.Addr, counted, ok bool) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil || l.trusted.Contains(ap.Addr()) {
		return netip.Addr{}, false, true
	}
	key = ap.Addr().Unmap()
	if key.Is6() {
		key = netip.PrefixFrom(key, l.v6Bits).Masked().Addr()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return key, false, false
	}
	l.open[key]++
	return key, true, true
}

// refuse tells a refused client why (on a plain listener) and closes,
// off the accept loop: the write has a short deadline (a short write to a
// fresh socket fits its buffer; the deadline is for a stuck peer) and at
// most maxRefusalWriters are under way.
func (l *connCap) refuse(c net.Conn) {
	l.refused.Inc()
	if l.refusal == nil {
		_ = c.Close()
		return
	}
	select {
	case l.writing <- struct{}{}:
		go func() {
			defer func() { <-l.writing }()
			writeRefusal(c, l.refusal)
			_ = c.Close()
		}()
	default:
		_ = c.Close()
	}
}

// writeRefusal writes refusal under a 100 ms deadline. A fresh socket
// takes a refusal's bytes into its send buffer whatever the peer does, so
// a timeout with nothing written is this goroutine's lateness (a starved
// process ran the write after its deadline had passed, and the write
// refused itself before trying), not the peer's: it is tried again, up to
// refusalTries times in all, instead of closing without a word.
func writeRefusal(c net.Conn, refusal []byte) {
	for range refusalTries {
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := c.Write(refusal)
		var ne net.Error
		if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
			return
		}
	}
}

// refusalTries bounds writeRefusal's tries.
const refusalTries = 3

func (l *ConnCounts) release(key netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// cappedConn gives its slot back on the first Close.
type cappedConn struct {
	net.Conn
	l    *connCap
	key  netip.Addr
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.key) })
	return err
}

// NetConn is the accepted connection under the cap's bookkeeping.
func (c *cappedConn) NetConn() net.Conn { return c.Conn }

// lateCappedConn is a balancer's connection: its client, named by the
// PROXY header, takes a slot on the first Read.
type lateCappedConn struct {
	*proxiedConn
	l       *connCap
	checked atomic.Bool
	refused error // admit's (set before checked), returned by every Read and Write after it

	mu              sync.Mutex
	counted, closed bool
	key             netip.Addr
}

func (c *lateCappedConn) Read(b []byte) (int, error) {
	if !c.checked.Load() {
		c.refused = c.admit()
		c.checked.Store(true)
	}
	if c.refused != nil {
		return 0, c.refused
	}
	return c.proxiedConn.Read(b)
}

// Write after a refusal writes nothing more: the refusal said it all.
func (c *lateCappedConn) Write(b []byte) (int, error) {
	if c.checked.Load() && c.refused != nil {
		return 0, c.refused
	}
	return c.proxiedConn.Write(b)
}

func (c *lateCappedConn) admit() error {
	if c.proxiedConn.header() != nil {
		return nil // no usable header: the Read that follows says why
	}
	key, counted, ok := c.l.admit(c.proxiedConn.RemoteAddr())
	if !ok {
		c.l.refused.Inc()
		if c.l.refusal != nil {
			writeRefusal(c.proxiedConn, c.l.refusal) // in the connection's own goroutine
		}
		return errTooManyConns
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if counted {
			c.l.release(key)
		}
		return net.ErrClosed
	}
	c.counted, c.key = counted, key
	return nil
}

func (c *lateCappedConn) Close() error {
	err := c.proxiedConn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && c.counted {
		c.l.release(c.key)
	}
	c.closed = true
	return err
}
