package origin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// The dial to an origin is fasthttp's (its DNS cache, its address
// rotation, its bound on dials in progress) but for how its timeout is
// judged. Go's dialer decides a timeout by which of two events its
// goroutine sees first when it runs: the connection's completion or the
// deadline's timer. An edge whose goroutines run late (a CPU-starved host,
// a long GC assist) sees the timer first although the kernel finished the
// handshake long before, and it would blame a healthy origin: three such
// dials take it out of rotation, and the requests behind them get 502s.
// Here the deadline asks the kernel instead: a socket already connected
// when the deadline is looked at is used (and counted in
// late_connects_total), and only one still connecting is abandoned.

// maxDialing bounds the dials in progress across every origin, as
// fasthttp's default dialer does (its Concurrency); a dial beyond it waits
// for a place within its own timeout.
const maxDialing = 1000

var dialing = make(chan struct{}, maxDialing)

// dnsCacheFor is how long a name's addresses are reused before they are
// resolved again (fasthttp's DefaultDNSCacheDuration).
const dnsCacheFor = time.Minute

// resolved is one name's addresses, used in turn.
type resolved struct {
	addrs []netip.AddrPort
	at    time.Time
	next  atomic.Uint32
	// refreshing lets one dial resolve an expired entry while the others
	// go on with the addresses they have.
	refreshing atomic.Bool
}

// dnsCache maps "host:port" to its *resolved addresses.
var dnsCache sync.Map

// errDialTimeout is the error of a dial whose deadline passed with the
// connection not established; it is fasthttp.ErrDialTimeout, so the
// timeouts_total phase and the logs read as they did.
func errDialTimeout(addr string) error {
	return fmt.Errorf("%w (%s)", fasthttp.ErrDialTimeout, addr)
}

// dialTCP connects to addr ("host:port"; the host an address or a name)
// within timeout, trying the name's addresses in turn until one connects
// or the time is up. late is called for a connection the deadline found
// established before the dial had returned.
func dialTCP(addr string, timeout time.Duration, late func()) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	select {
	case dialing <- struct{}{}:
	default:
		t := time.NewTimer(timeout)
		select {
		case dialing <- struct{}{}:
			t.Stop()
		case <-t.C:
			return nil, errDialTimeout(addr)
		}
	}
	defer func() { <-dialing }()

	addrs, first, err := lookup(addr, deadline)
	if err != nil {
		return nil, err
	}
	n := uint32(len(addrs))
	for i := range n - 1 {
		conn, err := connect(addrs[(first+i)%n], deadline, late)
		if err == nil || errors.Is(err, fasthttp.ErrDialTimeout) {
			return conn, err
		}
	}
	return connect(addrs[(first+n-1)%n], deadline, late)
}

// lookup returns addr's addresses and the index to start from (the
// next in turn); an address literal is its own.
func lookup(addr string, deadline time.Time) ([]netip.AddrPort, uint32, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return []netip.AddrPort{ap}, 0, nil
	}
	v, ok := dnsCache.Load(addr)
	r, _ := v.(*resolved)
	if ok && time.Since(r.at) > dnsCacheFor && r.refreshing.CompareAndSwap(false, true) {
		r = nil
	}
	if r == nil {
		addrs, err := resolve(addr, deadline)
		if err != nil {
			if v, ok := dnsCache.Load(addr); ok {
				v.(*resolved).refreshing.Store(false) // another dial may try again
			}
			return nil, 0, err
		}
		r = &resolved{addrs: addrs, at: time.Now()}
		dnsCache.Store(addr, r)
	}
	return r.addrs, r.next.Add(1), nil
}

func resolve(addr string, deadline time.Time) ([]netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	pn, err := net.LookupPort("tcp", port)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host) // IPv4, as fasthttp's dialer
	if err != nil {
		if ctx.Err() != nil {
			return nil, errDialTimeout(addr)
		}
		return nil, err
	}
	addrs := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		addrs = append(addrs, netip.AddrPortFrom(ip.Unmap(), uint16(pn)))
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("no address for %s", host)
	}
	return addrs, nil
}

// dialSeams are test seams: connected runs on the dialing goroutine once
// the connection is made, before the dial decides; checked runs after the
// deadline looked at the socket. Nil outside tests.
type dialSeams struct {
	connected func()
	checked   func()
}

var dialHooks atomic.Pointer[dialSeams]

// connect dials one address until deadline, judged as the package comment
// says.
func connect(ap netip.AddrPort, deadline time.Time, late func()) (net.Conn, error) {
	var (
		mu   sync.Mutex
		sock syscall.RawConn // the socket being connected, once made
		// looked says the deadline has passed and looked at the socket;
		// connected is what it found.
		looked, connected bool
	)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		mu.Lock()
		sock = c
		mu.Unlock()
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t := time.AfterFunc(time.Until(deadline), func() {
		mu.Lock()
		looked, connected = true, sock != nil && isConnected(sock)
		ok := connected
		mu.Unlock()
		if !ok {
			cancel()
		}
		if h := dialHooks.Load(); h != nil && h.checked != nil {
			h.checked()
		}
	})
	conn, err := d.DialContext(ctx, "tcp", ap.String())
	if h := dialHooks.Load(); err == nil && h != nil && h.connected != nil {
		h.connected()
	}
	t.Stop()
	mu.Lock()
	wasLate, timedOut := looked && connected, looked && !connected
	mu.Unlock()
	switch {
	case err == nil:
		if wasLate {
			late()
		}
		return conn, nil
	case timedOut:
		return nil, errDialTimeout(ap.String())
	default:
		return nil, err
	}
}

// lateConnect counts a connection the dial's deadline found established.
func (p *Proxy) lateConnect() { p.metrics.late.Inc() }
