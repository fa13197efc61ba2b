package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"

	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// GRPC is the service on a gRPC server, with gRPC health checking (the
// overall service "" and the rate limit service by name) and, when asked
// for, reflection.
type GRPC struct {
	Server *grpc.Server
	Health *health.Server
}

// GRPCOptions bound what one client connection may cost.
type GRPCOptions struct {
	// Creds serve TLS; nil serves plaintext.
	Creds credentials.TransportCredentials
	// MaxStreams is the calls one connection may have open at once
	// (SETTINGS_MAX_CONCURRENT_STREAMS; more are refused with
	// REFUSED_STREAM); 0 is DefaultMaxStreams. It also turns on grpc-go's
	// own rapid-reset guard: at most this many handlers run per
	// connection, and the connection is not read while they all do.
	MaxStreams uint32
	// Reflection serves gRPC server reflection (off: it tells anyone who
	// connects what the port serves).
	Reflection bool
}

// DefaultMaxStreams is GRPCOptions.MaxStreams' default: Envoy multiplexes
// its calls on a connection per worker, each call a few milliseconds, so
// 100 at once on one connection is thousands of calls a second.
const DefaultMaxStreams = 100

// Keepalive: a client may ping every 10 s at most, with or without a call
// open (a faster one is sent GOAWAY, too_many_pings); a connection quiet
// for a minute is pinged and closed if the ping is not answered in 20 s;
// one idle for 5 minutes, or open for 30, is told to go (GOAWAY) and given
// 30 s to finish its calls: the longest a stream that never sends its
// message can hold a handler (Envoy reconnects on GOAWAY at once).
var (
	keepaliveEnforcement = keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}
	keepaliveParams      = keepalive.ServerParameters{
		MaxConnectionIdle:     5 * time.Minute,
		MaxConnectionAge:      30 * time.Minute,
		MaxConnectionAgeGrace: 30 * time.Second,
		Time:                  time.Minute,
		Timeout:               20 * time.Second,
	}
)

// maxHeaderListBytes bounds one call's header block (grpc-go's default is
// 16 MiB); Envoy's calls carry a few hundred bytes.
const maxHeaderListBytes = 64 << 10

// Flow control windows, fixed: a call's messages are a few hundred bytes,
// so the per-call window (HTTP/2's initial 64 KiB) never fills, and the
// connection's lets a full set of streams send at once. Fixed windows turn
// off grpc-go's bandwidth-delay estimator, which otherwise pings the client
// (and updates the window) on every round of received data to grow the
// windows for bulk transfers this API never makes, up to 16 MiB a
// connection that a client could fill without reading its answers.
const (
	streamWindow = 64 << 10
	connWindow   = 1 << 20
)

// StreamWorkers is the least number of goroutines serving calls: parked
// ones cost a few KiB each.
const StreamWorkers = 256

// NewGRPC builds the gRPC server for s.
func NewGRPC(s *Server, opt GRPCOptions) *GRPC {
	if opt.MaxStreams == 0 {
		opt.MaxStreams = DefaultMaxStreams
	}
	opts := []grpc.ServerOption{
		// Calls run on a pool of goroutines whose stacks have already
		// grown to what a decision needs, instead of a fresh goroutine
		// each (whose stack is grown and copied on every call). A call
		// holds its worker while it waits for Redis, so the pool is sized
		// for the calls in flight, not for the cores: a call that finds
		// every worker busy gets a fresh goroutine.
		grpc.NumStreamWorkers(uint32(max(StreamWorkers, 4*runtime.GOMAXPROCS(0)))),
		grpc.Creds(newMeteredCreds(opt.Creds, s.metrics.resetFloods.Inc)),
		grpc.MaxConcurrentStreams(opt.MaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepaliveEnforcement),
		grpc.KeepaliveParams(keepaliveParams),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
	}
	g := &GRPC{Server: grpc.NewServer(opts...), Health: health.NewServer()}
	pb.RegisterRateLimitServiceServer(g.Server, s)
	healthpb.RegisterHealthServer(g.Server, g.Health)
	if opt.Reflection {
		reflection.Register(g.Server)
	}
	g.SetServing(s.Config() != nil)
	return g
}

// SetServing sets the health of both names: SERVING only with a
// configuration and while not draining.
func (g *GRPC) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	g.Health.SetServingStatus("", st)
	g.Health.SetServingStatus(pb.RateLimitService_ServiceDesc.ServiceName, st)
}

// Serve serves on ln until Stop.
func (g *GRPC) Serve(ln net.Listener) error {
	err := g.Server.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stop marks the service not serving, then lets calls in flight finish
// until ctx is done, when it closes what remains.
func (g *GRPC) Stop(ctx context.Context) {
	g.Health.Shutdown()
	done := make(chan struct{})
	go func() {
		g.Server.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.Server.Stop()
		<-done
	}
}

// TLSConfig builds the listener's TLS: a certificate and key (PEM files),
// and with clientCA, mutual TLS (clients must present a certificate that
// CA signed).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err == nil {
		err = certstore.Validate(&cert) // a chain clients can take, as the edge's own
	}
	if err != nil {
		return nil, fmt.Errorf("loading the rate limit service's certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("reading the rate limit service's client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("reading the rate limit service's client CA: no certificate in %s", clientCA)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// TrustFrom trusts callers whose address is in one of the prefixes to
// override limits.
func TrustFrom(prefixes []netip.Prefix) func(ctx context.Context) bool {
	if len(prefixes) == 0 {
		return nil
	}
	return func(ctx context.Context) bool {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return false
		}
		ap, err := netip.ParseAddrPort(p.Addr.String())
		if err != nil {
			return false
		}
		a := ap.Addr().Unmap()
		for _, pr := range prefixes {
			if pr.Contains(a) {
				return true
			}
		}
		return false
	}
}

// Reload loads the configuration directory and swaps it in; on any error
// the configuration in use stays and the error says why. A directory
// without documents is served as the reference serves it: every
// descriptor answered OK, said in a warning at each load.
func (s *Server) Reload(dir string, merge bool, opts ...rlsconfig.Option) error {
	c, err := rlsconfig.LoadDir(dir, merge, opts...)
	if err != nil {
		s.metrics.configLoads.WithLabelValues("error").Inc()
		return err
	}
	if len(c.Domains()) == 0 {
		s.log.Warn("rate limit configuration directory holds no document: every descriptor is answered OK until one is added", "dir", dir)
	}
	s.SetConfig(c)
	s.metrics.configLoads.WithLabelValues("ok").Inc()
	return nil
}

// LoadDocuments compiles documents given by name (a Consul key, say: it
// names the document in errors), in name order, and swaps them in; on any
// error the configuration in use stays and the error lists every problem.
// No document at all is an error too, as an empty directory is for Reload.
func (s *Server) LoadDocuments(docs map[string][]byte, merge bool, opts ...rlsconfig.Option) error {
	if len(docs) == 0 {
		s.metrics.configLoads.WithLabelValues("error").Inc()
		return errors.New("no rate limit service document")
	}
	names := make([]string, 0, len(docs))
	for n := range docs {
		names = append(names, n)
	}
	sort.Strings(names)
	var parsed []*rlsconfig.Document
	var errs []error
	for _, n := range names {
		d, err := rlsconfig.Parse(n, docs[n])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		parsed = append(parsed, d)
	}
	var c *rlsconfig.Config
	if len(errs) == 0 {
		var err error
		c, err = rlsconfig.Compile(parsed, merge, opts...)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		s.metrics.configLoads.WithLabelValues("error").Inc()
		return err
	}
	s.SetConfig(c)
	s.metrics.configLoads.WithLabelValues("ok").Inc()
	return nil
}
