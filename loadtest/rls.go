package edgeguard

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/grafana/sobek"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// rlsClient is one VU's client of Envoy's rate limit service
// (envoy.service.ratelimit.v3) at one address: what Envoy's global rate
// limit filter asks, asked by the script instead.
type rlsClient struct {
	mi      *ModuleInstance
	target  string
	conn    *grpc.ClientConn
	client  pb.RateLimitServiceClient
	timeout time.Duration
}

// rlsOptions are rls()'s second argument.
type rlsOptions struct {
	// Timeout bounds one call ("1s" by default; Envoy's filter waits 20 ms).
	Timeout string `json:"timeout"`
}

// RLS returns a client of the rate limit service at target (host:port,
// plaintext gRPC): rls(target[, {timeout}]). Each VU keeps one
// connection per target, made on first use.
func (mi *ModuleInstance) RLS(target string, opts sobek.Value) (*rlsClient, error) {
	var o rlsOptions
	if err := exportJSON(opts, &o); err != nil {
		return nil, fmt.Errorf("rls options: %w", err)
	}
	timeout := time.Second
	if o.Timeout != "" {
		d, err := time.ParseDuration(o.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("rls options: timeout %q: want a positive duration", o.Timeout)
		}
		timeout = d
	}
	if mi.rls == nil {
		mi.rls = map[string]*grpc.ClientConn{}
	}
	conn := mi.rls[target]
	if conn == nil {
		var err error
		if conn, err = grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, fmt.Errorf("rls %s: %w", target, err)
		}
		mi.rls[target] = conn
	}
	return &rlsClient{mi: mi, target: target, conn: conn, client: pb.NewRateLimitServiceClient(conn), timeout: timeout}, nil
}

// rlsEntry is one descriptor entry as scripts write it.
type rlsEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// rlsRequest is shouldRateLimit's argument.
type rlsRequest struct {
	Domain string `json:"domain"`
	// Descriptors: each an ordered list of entries, as Envoy's actions
	// build them.
	Descriptors [][]rlsEntry `json:"descriptors"`
	HitsAddend  uint32       `json:"hitsAddend"`
}

// RLSStatus is one descriptor's answer.
type RLSStatus struct {
	Code      string `js:"code"`
	Limit     uint32 `js:"limit"` // requests per unit; 0 without a limit
	Unit      string `js:"unit"`
	Remaining uint32 `js:"remaining"`
	// ResetSeconds is how long until the limit's window resets.
	ResetSeconds float64 `js:"resetSeconds"`
}

// RLSResult is shouldRateLimit's answer.
type RLSResult struct {
	// Code is the overall code: OK, OVER_LIMIT, or ERROR when the call
	// failed (then Error holds the gRPC status).
	Code       string      `js:"code"`
	Error      string      `js:"error"`
	Statuses   []RLSStatus `js:"statuses"`
	DurationMs float64     `js:"durationMs"`
}

// ShouldRateLimit asks the service once: shouldRateLimit({domain,
// descriptors: [[{key, value}, ...], ...], hitsAddend}). Each call is
// counted in edgeguard_rls_calls (tag code) and timed in
// edgeguard_rls_call_duration (ms), with the VU's tags and target.
func (c *rlsClient) ShouldRateLimit(v sobek.Value) (*RLSResult, error) {
	var r rlsRequest
	if err := exportJSON(v, &r); err != nil {
		return nil, fmt.Errorf("shouldRateLimit: %w", err)
	}
	if r.Domain == "" || len(r.Descriptors) == 0 {
		return nil, fmt.Errorf("shouldRateLimit: domain and descriptors are required")
	}
	req := &pb.RateLimitRequest{Domain: r.Domain, HitsAddend: r.HitsAddend, Descriptors: make([]*rlv3.RateLimitDescriptor, len(r.Descriptors))}
	for i, d := range r.Descriptors {
		entries := make([]*rlv3.RateLimitDescriptor_Entry, len(d))
		for j, e := range d {
			entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors[i] = &rlv3.RateLimitDescriptor{Entries: entries}
	}
	ctx := c.mi.vu.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	resp, err := c.client.ShouldRateLimit(ctx, req)
	res := &RLSResult{DurationMs: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		res.Code, res.Error = "ERROR", status.Convert(err).String()
	} else {
		res.Code = resp.OverallCode.String()
		for _, s := range resp.Statuses {
			st := RLSStatus{Code: s.Code.String(), Remaining: s.LimitRemaining, ResetSeconds: s.DurationUntilReset.AsDuration().Seconds()}
			if l := s.CurrentLimit; l != nil {
				st.Limit, st.Unit = l.RequestsPerUnit, l.Unit.String()
			}
			res.Statuses = append(res.Statuses, st)
		}
	}
	if c.mi.metrics != nil && c.mi.vu.State() != nil {
		tags := map[string]string{"code": res.Code, "rls_target": c.target}
		if err := c.mi.push(c.mi.metrics.rlsCalls, 1, tags); err != nil {
			return nil, err
		}
		if err := c.mi.push(c.mi.metrics.rlsDuration, res.DurationMs, tags); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// Close closes the VU's connection to the target (the next rls() call
// for it makes a new one).
func (c *rlsClient) Close() error {
	if c.mi.rls[c.target] == c.conn {
		delete(c.mi.rls, c.target)
	}
	return c.conn.Close()
}

// exportJSON reads a script's object into dst through JSON, so field names
// are the ones scripts write (unknown ones are errors); undefined leaves
// dst as it is.
func exportJSON(v sobek.Value, dst any) error {
	if v == nil || sobek.IsUndefined(v) || sobek.IsNull(v) {
		return nil
	}
	data, err := json.Marshal(v.Export())
	if err != nil {
		return err
	}
	return decodeStrict(data, dst)
}
