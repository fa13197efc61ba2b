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

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"

	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// GRPC is the service on a gRPC server, with gRPC health checking (the
// overall service "" and the rate limit service by name) and reflection.
type GRPC struct {
	Server *grpc.Server
	Health *health.Server
}

// NewGRPC builds the gRPC server for s; creds nil serves plaintext.
func NewGRPC(s *Server, creds credentials.TransportCredentials) *GRPC {
	// Calls run on a pool of goroutines whose stacks have already grown
	// to what a decision needs, instead of a fresh goroutine each (whose
	// stack is grown and copied on every call).
	opts := []grpc.ServerOption{grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0)))}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	g := &GRPC{Server: grpc.NewServer(opts...), Health: health.NewServer()}
	pb.RegisterRateLimitServiceServer(g.Server, s)
	healthpb.RegisterHealthServer(g.Server, g.Health)
	reflection.Register(g.Server)
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
// the configuration in use stays and the error says why.
func (s *Server) Reload(dir string, merge bool) error {
	c, err := rlsconfig.LoadDir(dir, merge)
	if err != nil {
		s.metrics.configLoads.WithLabelValues("error").Inc()
		return err
	}
	s.SetConfig(c)
	s.metrics.configLoads.WithLabelValues("ok").Inc()
	return nil
}

// LoadDocuments compiles documents given by name (a Consul key, say: it
// names the document in errors), in name order, and swaps them in; on any
// error the configuration in use stays and the error lists every problem.
// No document at all is an error too, as an empty directory is for Reload.
func (s *Server) LoadDocuments(docs map[string][]byte, merge bool) error {
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
		c, err = rlsconfig.Compile(parsed, merge)
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
