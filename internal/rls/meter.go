package rls

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Rapid reset (CVE-2023-44487) on the gRPC port. With MaxConcurrentStreams
// set, grpc-go runs at most that many handlers per connection and stops
// reading the connection until one ends, so a HEADERS + RST_STREAM loop
// cannot start handlers without bound; it still never closes the
// connection, and every stream beyond the cap costs a REFUSED_STREAM.
// The meter closes a connection whose resets, the client's RST_STREAM
// frames and the ones the server is provoked into (refused streams,
// expired deadlines), pass a budget: ResetBurst at once, ResetRate a
// second over time.
//
// The budget is wider than the proxy port's HTTP/2 one (200, 100 a
// second): Envoy cancels a rate limit call whose timeout (20 ms by
// default) passes, so a slow store makes an honest Envoy reset calls at
// its request rate. Hundreds a second on one connection for seconds on
// end is still no client's work but an attack's: the loop sent
// 71,000 a second.
const (
	ResetBurst = 1000
	ResetRate  = 500 // per second
)

// errResetFlood ends a connection that spent its reset budget.
var errResetFlood = errors.New("rls: rapid reset: reset budget spent")

// meteredCreds wraps the transport credentials (nil: plaintext) so every
// connection the server reads, decrypted, passes the meter.
type meteredCreds struct {
	credentials.TransportCredentials
	flood func() // counts a connection closed for a flood
}

func newMeteredCreds(inner credentials.TransportCredentials, flood func()) credentials.TransportCredentials {
	if inner == nil {
		inner = insecure.NewCredentials()
	}
	return &meteredCreds{TransportCredentials: inner, flood: flood}
}

func (c *meteredCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	m := &meteredConn{Conn: conn, flood: c.flood, resets: rate.NewLimiter(ResetRate, ResetBurst)}
	m.in.preface = len(clientPreface)
	return m, info, nil
}

func (c *meteredCreds) Clone() credentials.TransportCredentials {
	return &meteredCreds{TransportCredentials: c.TransportCredentials.Clone(), flood: c.flood}
}

// ClientHandshake is the inner credentials' (the server never dials).
func (c *meteredCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
}

// clientPreface opens every HTTP/2 connection a client makes (RFC 9113 §3.4).
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// frameRSTStream is HTTP/2's RST_STREAM frame type (RFC 9113 §6.4).
const frameRSTStream = 0x3

// meteredConn follows the frame headers both ways (grpc-go reads from
// one goroutine and writes mostly from another) and fails the read or
// write that spends the reset budget, which ends the connection.
type meteredConn struct {
	net.Conn
	flood func()

	in  frameScanner // read side: only its goroutine touches it
	out frameScanner // write side: under mu

	mu     sync.Mutex
	resets *rate.Limiter
	err    error
}

func (c *meteredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if resets := c.in.scan(b[:n]); resets > 0 {
		if ferr := c.spend(resets); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

func (c *meteredConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	resets := c.out.scan(b)
	c.mu.Unlock()
	if resets > 0 {
		if err := c.spend(resets); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

// spend takes n resets from the budget; past it the connection is closed
// (once, counted) and every later read and write fails.
func (c *meteredConn) spend(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	now := time.Now()
	for range n {
		if !c.resets.AllowN(now, 1) {
			c.err = errResetFlood
			c.flood()
			_ = c.Conn.Close()
			return c.err
		}
	}
	return nil
}

// frameScanner follows HTTP/2 frame boundaries in a byte stream and counts
// RST_STREAM frames.
type frameScanner struct {
	preface int // bytes of the client preface still to pass
	hdr     [9]byte
	hn      int // bytes of hdr read
	skip    int // payload bytes still to pass
}

func (s *frameScanner) scan(p []byte) (resets int) {
	for len(p) > 0 {
		switch {
		case s.preface > 0:
			k := min(s.preface, len(p))
			s.preface, p = s.preface-k, p[k:]
			continue
		case s.skip > 0:
			k := min(s.skip, len(p))
			s.skip, p = s.skip-k, p[k:]
			continue
		}
		k := copy(s.hdr[s.hn:], p)
		s.hn, p = s.hn+k, p[k:]
		if s.hn < len(s.hdr) {
			return resets
		}
		s.hn = 0
		s.skip = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
		if s.hdr[3] == frameRSTStream {
			resets++
		}
	}
	return resets
}
