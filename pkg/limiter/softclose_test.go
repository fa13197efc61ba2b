package limiter_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A take whose reply is on its way when the Sentinel client switches
// masters (go-redis then closes every connection to the old master, those
// in use too) is answered: the reply is read, the take admitted, and Redis
// counts exactly what was admitted. Before, the call failed with "use of
// closed network connection" though it had run, and its unit was lost.
func TestReplyOwedAtASentinelSwitchIsRead(t *testing.T) {
	d, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	defer d.Close()
	old, err := d.MasterAddr(ctx(t))
	require.NoError(t, err)

	// The edge reaches the old master through a proxy that can hold
	// Redis's replies; the new master directly.
	px := newHoldingProxy(t, old)
	soft := make(chan struct{}, 16)
	defer limiter.OnSoftClose(func() { soft <- struct{}{} })()
	c, err := limiter.NewRedisClient(d.URL(), limiter.ModeSentinel, limiter.DialMap{old: px.addr})
	require.NoError(t, err)
	defer c.Close()
	st := redisStore(t, c)
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.FixedWindow, Limit: 100, Window: time.Hour}
	admitted := takeN(t, st, l, 3)
	require.EqualValues(t, 3, admitted)

	// A take runs on the old master; its reply is held.
	px.hold()
	type answer struct {
		ds  []limiter.Decision
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ds, err := st.Take(c, []limiter.Request{{Limit: l, Cost: 1}})
		answered <- answer{ds, err}
	}()
	select {
	case <-px.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the take's reply never reached the proxy")
	}

	// The switch: the client closes its connections to the old master.
	failedOver := make(chan error, 1)
	go func() { _, err := d.Failover(context.Background()); failedOver <- err }()
	select {
	case <-soft:
	case a := <-answered:
		t.Fatalf("the take ended before its reply was released: %+v, %v", a.ds, a.err)
	case err := <-failedOver:
		require.NoError(t, err)
		select {
		case <-soft:
		case a := <-answered:
			t.Fatalf("the take ended before its reply was released: %+v, %v", a.ds, a.err)
		case <-time.After(20 * time.Second):
			t.Fatal("the client never closed its connection to the old master")
		}
	case <-time.After(40 * time.Second):
		t.Fatal("no switch")
	}
	px.release()
	a := <-answered
	require.NoError(t, a.err, "the reply was owed when the connection was closed")
	require.EqualValues(t, 1, a.ds[0].Admitted)
	admitted += a.ds[0].Admitted
	require.NoError(t, <-failedOver)

	// Later takes reach the new master, which counts every admission.
	admitted += takeEventually(t, st, l, 5)
	require.EqualValues(t, 9, admitted)
	newMaster, err := d.MasterAddr(ctx(t))
	require.NoError(t, err)
	require.NotEqual(t, old, newMaster)
	direct := redis.NewClient(&redis.Options{Addr: newMaster})
	defer direct.Close()
	var counted int64
	fields, err := direct.HGetAll(ctx(t), st.Keys(l)[0]).Result()
	require.NoError(t, err)
	for _, v := range fields { // one field per window start
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		counted += n
	}
	require.Equal(t, admitted, counted, "Redis counts what was admitted")
}

// holdingProxy relays TCP to one address and can hold the replies: once
// held, the next reply read from upstream waits until release.
type holdingProxy struct {
	addr    string
	holding atomic.Bool
	held    chan struct{} // gets a value when a reply is held
	gate    chan struct{} // closed by release
	once    sync.Once
}

func newHoldingProxy(t *testing.T, upstream string) *holdingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdingProxy{addr: ln.Addr().String(), held: make(chan struct{}, 1), gate: make(chan struct{})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		p.release()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, down, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, down); up.Close() })
			wg.Go(func() {
				defer down.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 && p.holding.Load() {
						select {
						case p.held <- struct{}{}:
						default:
						}
						<-p.gate
					}
					if n > 0 {
						if _, werr := down.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

func (p *holdingProxy) hold() { p.holding.Store(true) }

func (p *holdingProxy) release() {
	p.once.Do(func() {
		p.holding.Store(false)
		close(p.gate)
	})
}
