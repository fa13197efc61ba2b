package rls_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// hostile is a client that speaks HTTP/2 frames over plain TCP (h2c) to
// the gRPC port, as an attacker does: it opens calls and never sends
// their message, or resets them at once.
type hostile struct {
	c   net.Conn
	bw  *bufio.Writer
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
	id  uint32

	mu       sync.Mutex
	refused  int // streams the server refused (RST_STREAM REFUSED_STREAM)
	settings map[http2.SettingID]uint32
	closed   chan struct{} // the server closed the connection
	gotSets  chan struct{}
	acks     chan struct{} // a SETTINGS ACK: every frame sent before it was read
	pings    int           // PING frames the server sent (not acks of the client's)
	ended    chan struct{} // a stream the server ended (its trailers)
}

func dialHostile(t *testing.T, addr string) *hostile {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	h := &hostile{c: c, bw: bufio.NewWriterSize(c, 64<<10), id: 1, closed: make(chan struct{}), gotSets: make(chan struct{}), acks: make(chan struct{}, 1024), ended: make(chan struct{}, 1024), settings: map[http2.SettingID]uint32{}}
	h.fr = http2.NewFramer(h.bw, c)
	h.enc = hpack.NewEncoder(&h.hb)
	_, err = h.bw.WriteString(http2.ClientPreface)
	require.NoError(t, err)
	require.NoError(t, h.fr.WriteSettings())
	require.NoError(t, h.bw.Flush())
	go h.read()
	select {
	case <-h.gotSets:
	case <-time.After(10 * time.Second):
		t.Fatal("no SETTINGS from the server")
	}
	return h
}

// read drains what the server sends until it closes the connection.
func (h *hostile) read() {
	defer close(h.closed)
	rd := http2.NewFramer(discard{}, h.c)
	first := true
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				h.acks <- struct{}{}
			}
			if !f.IsAck() && first {
				h.mu.Lock()
				_ = f.ForeachSetting(func(s http2.Setting) error { h.settings[s.ID] = s.Val; return nil })
				h.mu.Unlock()
				first = false
				close(h.gotSets)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.mu.Lock()
				h.pings++
				h.mu.Unlock()
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				h.ended <- struct{}{}
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode == http2.ErrCodeRefusedStream {
				h.mu.Lock()
				h.refused++
				h.mu.Unlock()
			}
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// open starts a ShouldRateLimit call and sends nothing more (no message,
// no END_STREAM); with reset, it resets the call at once. It reports
// false once the connection cannot be written.
func (h *hostile) open(reset bool) bool {
	h.hb.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "rls"},
		{":path", "/" + pb.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	id := h.id
	h.id += 2
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hb.Bytes(), EndHeaders: true}); err != nil {
		return false
	}
	if reset {
		if err := h.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			return false
		}
	}
	return true
}

// send sends a whole ShouldRateLimit call: its headers, then its message
// (gRPC's length-prefixed framing) in a DATA frame that ends the stream.
func (h *hostile) send(t *testing.T, req *pb.RateLimitRequest) {
	t.Helper()
	id := h.id
	require.True(t, h.open(false))
	msg, err := proto.Marshal(req)
	require.NoError(t, err)
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	require.NoError(t, h.fr.WriteData(id, true, append(framed, msg...)))
}

func (h *hostile) flush() bool { return h.bw.Flush() == nil }

// barrier sends an empty SETTINGS frame and waits for its ACK: the server
// has then read every frame sent before it. false: the connection closed.
func (h *hostile) barrier() bool {
	if h.fr.WriteSettings() != nil || !h.flush() {
		return false
	}
	select {
	case <-h.acks:
		return true
	case <-h.closed:
		return false
	}
}

func (h *hostile) refusedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused
}

// serveHostile is a service on loopback whose metrics can be read.
func serveHostile(t *testing.T, opt rls.GRPCOptions) (addr string, reg *prometheus.Registry, client pb.RateLimitServiceClient) {
	t.Helper()
	reg = prometheus.NewRegistry()
	l, err := limiter.New(limiter.NewMemoryStore(), limiter.Config{StoreName: "memory"}, nil, quietSlog())
	require.NoError(t, err)
	t.Cleanup(l.Close)
	srv, err := rls.New(rls.Options{Limiter: l}, reg, quietSlog())
	require.NoError(t, err)
	require.NoError(t, srv.LoadDocuments(map[string][]byte{"d.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n")}, false))
	g := rls.NewGRPC(srv, opt)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	t.Cleanup(func() {
		g.Server.Stop()
		require.NoError(t, <-done)
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return ln.Addr().String(), reg, pb.NewRateLimitServiceClient(conn)
}

func call(t *testing.T, c pb.RateLimitServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", "v")}})
	require.NoError(t, err)
	require.Equal(t, ok, r.OverallCode)
}

// TestHostileStreamsCapped: the server announces its stream cap, refuses
// every stream beyond it (calls that never send their message hold only
// the cap's worth), and serves an ordinary client meanwhile; a client
// that keeps opening streams past the cap provokes refusals that spend
// its reset budget, and the connection is closed.
func TestHostileStreamsCapped(t *testing.T) {
	addr, reg, client := serveHostile(t, rls.GRPCOptions{})
	h := dialHostile(t, addr)
	require.EqualValues(t, rls.DefaultMaxStreams, h.settings[http2.SettingMaxConcurrentStreams])

	const extra = 50
	for range rls.DefaultMaxStreams + extra {
		require.True(t, h.open(false))
	}
	require.True(t, h.flush())
	require.Eventually(t, func() bool { return h.refusedCount() == extra }, 10*time.Second, 5*time.Millisecond)
	call(t, client) // an ordinary client is served beside the held streams

	// Every refusal counts against the budget: the connection goes before
	// the attacker's 50,000 streams do.
	sent := rls.DefaultMaxStreams + extra
	for sent < 50_000 && h.open(false) {
		sent++
		if sent%100 == 0 && !h.flush() {
			break
		}
	}
	h.flush()
	select {
	case <-h.closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("connection still open after %d streams, %d refused", sent, h.refusedCount())
	}
	require.LessOrEqual(t, h.refusedCount(), rls.ResetBurst+rls.ResetRate*30, "refused no more than the budget allows")
	require.EqualValues(t, 1, testenv.Counter(t, reg, "edgeguard_rls_reset_floods_total"))
	t.Logf("streams sent %d, refused %d before the connection was closed", sent, h.refusedCount())
	call(t, client)
}

// TestHostileRapidReset: a loop of HEADERS and RST_STREAM is closed
// within the reset budget (before: 712,000 streams in 10 s and the
// connection stayed open), and ordinary calls are served after it. The
// loop sends a batch, then waits for the server to have read it (a
// SETTINGS frame's ACK), so what it sent is what the server read, to a
// batch.
func TestHostileRapidReset(t *testing.T) {
	addr, reg, client := serveHostile(t, rls.GRPCOptions{})
	start := time.Now() // before the server's budget starts
	h := dialHostile(t, addr)
	require.True(t, h.barrier()) // the ACK of the client's first SETTINGS
	const batch = 50
	read := 0 // pairs the server has read
	for read < 200_000 {
		for range batch {
			h.open(true)
		}
		if !h.barrier() {
			break
		}
		read += batch
	}
	elapsed := time.Since(start)
	select {
	case <-h.closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("connection still open after %d resets", read)
	}
	// The budget over the time the connection lived, to a batch (a
	// batch's barrier passes while the server has budget for its start).
	budget := rls.ResetBurst + int(elapsed.Seconds()*rls.ResetRate) + batch
	require.LessOrEqual(t, read, budget, "closed within the budget (%s)", elapsed)
	require.GreaterOrEqual(t, read, rls.ResetBurst-batch, "not before the burst is spent")
	require.EqualValues(t, 1, testenv.Counter(t, reg, "edgeguard_rls_reset_floods_total"))
	t.Logf("%d HEADERS+RST_STREAM pairs read by the server in %s before it closed the connection", read, elapsed)
	call(t, client)
}

// TestNoBandwidthPings: the server's flow control windows are fixed, so
// calls cost no PING frames: grpc-go's bandwidth-delay estimator, on by
// default, pings the client on the first data it receives and again after
// each ack (each ping and ack a write and a read more for the server;
// this client never acks, so the estimator's first ping is all it could
// see). The calls are all answered, on the window the server announced.
func TestNoBandwidthPings(t *testing.T) {
	addr, _, _ := serveHostile(t, rls.GRPCOptions{})
	h := dialHostile(t, addr)
	const calls = 50
	for i := range calls {
		// One call a round: each round's data is what a ping measures.
		h.send(t, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", strconv.Itoa(i))}})
		require.True(t, h.flush())
		select {
		case <-h.ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d not answered", i)
		}
	}
	require.True(t, h.barrier()) // every frame the server sent before the ACK was read
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Zero(t, h.pings, "PING frames from the server over %d calls", calls)
	require.EqualValues(t, 64<<10, h.settings[http2.SettingInitialWindowSize])
}

// TestReflectionOffByDefault: reflection answers Unimplemented unless
// asked for.
func TestReflectionOffByDefault(t *testing.T) {
	for _, on := range []bool{false, true} {
		addr, _, _ := serveHostile(t, rls.GRPCOptions{Reflection: on})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		require.NoError(t, err)
		// Send may see io.EOF once the server ended the stream; Recv says why.
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
		if on {
			require.NoError(t, err)
		} else {
			require.Equal(t, codes.Unimplemented, status.Code(err))
		}
		cancel()
		_ = conn.Close()
	}
}

func quietSlog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
