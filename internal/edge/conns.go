package edge

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// connCap caps the connections one client may hold open, counted by socket
// peer (X-Forwarded-For is not known at accept): an IPv4 address, or an
// IPv6 client's --ipv6-prefix network. Trusted proxies are not capped: each
// carries many clients. fasthttp's Server.MaxConnsPerIP would do the
// counting but skips IPv6 peers and races with Server.Shutdown (its
// pooled conn wrapper is cleared on Close while the serving goroutine
// still reads through it), so the edge counts at its listener.
type connCap struct {
	net.Listener
	max     int
	v6Bits  int
	trusted trustedSet
	refused prometheus.Counter

	mu   sync.Mutex
	open map[netip.Addr]int
}

func newConnCap(ln net.Listener, max, v6Bits int, trusted trustedSet, refused prometheus.Counter) net.Listener {
	if max <= 0 {
		return ln
	}
	return &connCap{Listener: ln, max: max, v6Bits: v6Bits, trusted: trusted, refused: refused, open: map[netip.Addr]int{}}
}

// tooManyConns is written to a refused connection before it is closed.
const tooManyConns = "HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 38\r\nRetry-After: 1\r\n\r\ntoo many connections from your address"

func (l *connCap) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
		if err != nil || l.trusted.contains(ap.Addr()) {
			return c, nil
		}
		key := ap.Addr().Unmap()
		if key.Is6() {
			key = netip.PrefixFrom(key, l.v6Bits).Masked().Addr()
		}
		l.mu.Lock()
		full := l.open[key] >= l.max
		if !full {
			l.open[key]++
		}
		l.mu.Unlock()
		if full {
			l.refused.Inc()
			// A short write to a fresh socket fits its buffer; the
			// deadline keeps a stuck peer from holding the accept loop.
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write([]byte(tooManyConns))
			_ = c.Close()
			continue
		}
		return &cappedConn{Conn: c, l: l, key: key}, nil
	}
}

func (l *connCap) release(key netip.Addr) {
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
