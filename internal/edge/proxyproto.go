package edge

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"
)

// The PROXY protocol (v1 and v2), from the L4 balancers in
// --proxy-protocol-from only. A connection from a balancer must start with
// a PROXY header, whose source becomes the connection's peer address (a
// socket peer like any other for the trust model: trusted only if in
// --trusted-proxies); a balancer connection without one is refused, since
// it means the balancer is not configured to send it. From anyone else a
// PROXY header is refused and a plain connection served as is.

// proxyListener wraps every accepted connection in a proxiedConn.
type proxyListener struct {
	*proxyproto.Listener
	from    trustedSet
	refused *prometheus.CounterVec // reason
	log     *slog.Logger
	lastLog atomic.Int64 // unix nanos of the last "missing header" warning
}

func newProxyListener(ln net.Listener, from trustedSet, headerTimeout time.Duration, refused *prometheus.CounterVec, log *slog.Logger) *proxyListener {
	l := &proxyListener{from: from, refused: refused, log: log}
	l.Listener = &proxyproto.Listener{
		Listener:          ln,
		ReadHeaderTimeout: headerTimeout,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if l.from.contains(addrOf(o.Upstream)) {
				return proxyproto.REQUIRE, nil
			}
			return proxyproto.REJECT, nil
		},
	}
	return l
}

func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return peerAddr(t.IP)
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

func (l *proxyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pc, ok := c.(*proxyproto.Conn)
	if !ok {
		return c, nil
	}
	sock := pc.Raw().RemoteAddr()
	return &proxiedConn{Conn: pc, l: l, balancer: l.from.contains(addrOf(sock)), socket: sock}, nil
}

// proxiedConn is an accepted connection under the PROXY protocol policy:
// its first Read reads (or refuses) the header.
type proxiedConn struct {
	*proxyproto.Conn
	l        *proxyListener
	balancer bool
	socket   net.Addr
	read     bool
}

// socketAddr is the socket peer (the balancer, for a balancer's connection).
func (c *proxiedConn) socketAddr() net.Addr { return c.socket }

func (c *proxiedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.read {
		c.read = true
		if err != nil {
			c.l.refuse(c, err)
		}
	}
	return n, err
}

// refuse counts and logs a connection the PROXY policy refused.
func (l *proxyListener) refuse(c *proxiedConn, err error) {
	switch {
	case errors.Is(err, proxyproto.ErrNoProxyProtocol) && c.balancer:
		l.refused.WithLabelValues("missing_header").Inc()
		// A misconfigured balancer refuses every connection: say so, at
		// most every 10 s.
		now := time.Now().UnixNano()
		if last := l.lastLog.Load(); now-last > int64(10*time.Second) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Warn("connection from a --proxy-protocol-from balancer without a PROXY header refused: is the balancer configured to send PROXY protocol (v1 or v2)?", "balancer", c.socket.String())
		}
	case errors.Is(err, proxyproto.ErrSuperfluousProxyHeader):
		l.refused.WithLabelValues("untrusted_source").Inc()
		l.log.Debug("PROXY header from a peer not in --proxy-protocol-from refused", "peer", c.socket.String())
	case strings.HasPrefix(err.Error(), "proxyproto:"):
		l.refused.WithLabelValues("invalid_header").Inc()
		l.log.Debug("invalid PROXY header refused", "peer", c.socket.String(), "err", err)
	}
}
