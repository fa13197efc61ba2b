// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from
// edgeguard's limiter, with envoyproxy/ratelimit's configuration
// (package rlsconfig).
//
// One call, in order:
//
//  1. Check the request (a domain and at least one descriptor, else
//     InvalidArgument) and take the current configuration snapshot.
//  2. Match each descriptor (rlsconfig.Config.Lookup), or take its limit
//     override when the caller is trusted to send one.
//  3. Drop limits another matched limit replaces; answer unlimited and
//     unmatched descriptors OK without counting.
//  4. Count the rest in one limiter decision (one Redis round trip per node;
//     the limiter's fallback answers when Redis cannot). Descriptors are
//     counted independently, as the reference counts them: one over its
//     limit does not undo what the others took. A descriptor whose own
//     hits_addend is 0 is looked at, not counted (limiter.Check.Peek).
//  5. Answer a status per descriptor, in order, the overall code, and,
//     when the operator asks for them (Options.Headers), the RateLimit
//     header fields for Envoy to add to the response. Envoy passes those
//     on to the client, so they name a limit by its rate_limit name, else
//     by a salted hash of its descriptor path: a path holds domain, keys
//     and values (route and cluster names, other clients' addresses) that
//     are not the client's to read (Options.Names).
package rls

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// Decider decides a request's checks: *limiter.Limiter.
type Decider interface {
	Decide(ctx context.Context, checks []limiter.Check) (limiter.Verdict, error)
}

// Headers is which header fields the service asks Envoy to add.
type Headers string

// The header modes.
const (
	// HeadersDraft: RateLimit-Policy and RateLimit (IETF
	// httpapi-ratelimit-headers), one item per applied limit.
	HeadersDraft Headers = "draft"
	// HeadersLegacy: the reference's RateLimit-Limit, RateLimit-Remaining
	// and RateLimit-Reset, for the limit closest to (or over) its quota.
	HeadersLegacy Headers = "legacy"
	// HeadersOff adds none, as the reference by default (its
	// LIMIT_RESPONSE_HEADERS_ENABLED is off unless set).
	HeadersOff Headers = "off"
)

// ParseHeaders reads a header mode; "" is off.
func ParseHeaders(s string) (Headers, error) {
	switch h := Headers(s); h {
	case "":
		return HeadersOff, nil
	case HeadersDraft, HeadersLegacy, HeadersOff:
		return h, nil
	}
	return "", errors.New("want off, draft or legacy")
}

// Names is how the draft header fields name a limit that has no
// rate_limit name.
type Names string

// The naming modes.
const (
	// NamesHashed: "rl-" and 12 hex digits of an HMAC-SHA256, keyed by
	// Options.NameSalt, of the descriptor path. Stable for one salt, and
	// no descriptor value (nor domain or key) can be read back from it.
	NamesHashed Names = "hashed"
	// NamesPath: the descriptor path itself (domain.key_value...), as a
	// debugging aid. It shows every client the domain, keys and values of
	// the limits applied to it: internal route and cluster names, header
	// values, and the values configured for other clients.
	NamesPath Names = "path"
)

// ParseNames reads a naming mode; "" is hashed.
func ParseNames(s string) (Names, error) {
	switch n := Names(s); n {
	case "":
		return NamesHashed, nil
	case NamesHashed, NamesPath:
		return n, nil
	}
	return "", errors.New("want hashed or path")
}

// Options build a Server.
type Options struct {
	Limiter Decider
	// Nodes is how many nodes share the region's limits: the fallback's
	// share when Redis cannot be asked. 0 means 1.
	Nodes func() int
	// TrustOverride reports whether the caller may override a
	// descriptor's limit (the request's descriptor limit field); nil
	// trusts nobody: an override from an untrusted caller is ignored and
	// the configured limit applies.
	TrustOverride func(ctx context.Context) bool
	// Shadow answers OK whatever the limits say (the reference's
	// SHADOW_MODE), still counting.
	Shadow bool
	// Quota makes every applied limit a quota limit (the reference's
	// QUOTA_MODE): the call is over the limit only when all are over.
	Quota bool
	// Headers is which header fields the answers carry; "" is off.
	Headers Headers
	// LegacyNames renames the legacy fields (the reference's
	// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); an
	// empty name keeps RateLimit-Limit, RateLimit-Remaining or
	// RateLimit-Reset.
	LegacyNames struct{ Limit, Remaining, Reset string }
	// Names is how the draft fields name a limit without a rate_limit
	// name; "" is hashed.
	Names Names
	// NameSalt keys the hashed names; every service behind one Envoy
	// cluster should share it so a limit keeps its name. Empty: a random
	// salt of the process's own (names then differ between processes).
	NameSalt []byte
	// Now is the clock for answers decided without the limiter (tests).
	Now func() time.Time
	// Observer, when set, is called once per applied descriptor (a limit
	// enforced or shadowed, not unlimited, unmatched or replaced ones) of
	// every answered call, after the call's codes are settled.
	Observer func(Observation)
}

// Observation is one applied descriptor, as an Observer sees it.
type Observation struct {
	Domain string
	// Limit is the limit applied; its Path names the descriptor
	// (domain.key_value.key).
	Limit *rlsconfig.Limit
	// Hits is what the descriptor counted: its hits addend; 0 for a look
	// (a descriptor's hits_addend of 0), which counts nothing.
	Hits uint64
	// Over: the descriptor was over its limit (answered OK when the limit
	// is in shadow mode).
	Over bool
	// Remaining is what the limit had left: after the hits when they were
	// admitted, before them when over; -1 when the hits could never be
	// admitted (a quota of 0, or more hits than the limit holds) and no
	// count was asked for.
	Remaining int64
}

// Server implements pb.RateLimitServiceServer.
type Server struct {
	pb.UnimplementedRateLimitServiceServer
	opt     Options
	config  atomic.Pointer[rlsconfig.Config]
	metrics *metrics
	log     *slog.Logger
}

var _ pb.RateLimitServiceServer = (*Server)(nil)

// New builds a Server; it answers errors until SetConfig gives it a
// configuration.
func New(opt Options, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if opt.Headers == "" {
		opt.Headers = HeadersOff
	}
	if opt.Names == "" {
		opt.Names = NamesHashed
	}
	if len(opt.NameSalt) == 0 {
		opt.NameSalt = make([]byte, 32)
		_, _ = rand.Read(opt.NameSalt) // never fails (crypto/rand's contract)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	for _, n := range []struct {
		name *string
		def  string
	}{{&opt.LegacyNames.Limit, "RateLimit-Limit"}, {&opt.LegacyNames.Remaining, "RateLimit-Remaining"}, {&opt.LegacyNames.Reset, "RateLimit-Reset"}} {
		if *n.name == "" {
			*n.name = n.def
		}
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Server{opt: opt, metrics: m, log: log}, nil
}

// RefusedConns counts the connections a listener's per-address cap
// refused (edgeguard_rls_connections_refused_total).
func (s *Server) RefusedConns() prometheus.Counter { return s.metrics.refusedConns }

// SetConfig swaps the configuration every later call uses.
func (s *Server) SetConfig(c *rlsconfig.Config) { s.config.Store(c) }

// Config is the configuration in use (nil before the first SetConfig).
func (s *Server) Config() *rlsconfig.Config { return s.config.Load() }

// item is one descriptor on its way through a call.
type item struct {
	lim     *rlsconfig.Limit
	match   rlsconfig.Match
	cost    uint64
	check   int // index in checks, -1 when not counted
	st      *pb.RateLimitResponse_DescriptorStatus
	applied bool  // a limit was enforced (or shadowed) for it
	left    int64 // the limiter's remaining (Observation.Remaining)
}

// ShouldRateLimit implements the service.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	switch {
	case err != nil:
		s.metrics.errorCalls.Inc()
	case resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT:
		s.metrics.overCalls.Inc()
	default:
		s.metrics.okCalls.Inc()
	}
	s.metrics.duration.Observe(time.Since(start).Seconds())
	return resp, err
}

// MaxDescriptors and MaxEntries bound one ShouldRateLimit call (more is
// InvalidArgument).
const (
	MaxDescriptors = 256
	MaxEntries     = 64
)

func (s *Server) shouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	// Bounds on one call's work: Envoy sends a descriptor per rate limit
	// action that applies, each of a few entries; a caller sending
	// thousands asks for a batch no decision needs.
	if n := len(req.Descriptors); n > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors in one request: at most %d", n, MaxDescriptors)
	}
	for _, d := range req.Descriptors {
		if n := len(d.GetEntries()); n > MaxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "a descriptor of %d entries: at most %d", n, MaxEntries)
		}
	}
	cfg := s.config.Load()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	var itemBuf [4]item
	items := itemBuf[:0]
	if n := len(req.Descriptors); n > len(itemBuf) {
		items = make([]item, 0, n)
	}
	items = items[:len(req.Descriptors)]
	var replaced map[string]bool
	var trusted, asked bool
	var entryBuf [4]rlsconfig.Entry
	for i, d := range req.Descriptors {
		it := &items[i]
		it.check = -1
		// As the reference: the descriptor's hits_addend when set, 0
		// included (a look without counting); else the request's, 0
		// meaning 1.
		it.cost = uint64(max(1, req.HitsAddend))
		if h := d.GetHitsAddend(); h != nil {
			it.cost = h.GetValue()
		}
		if o := d.GetLimit(); o != nil {
			if !asked {
				trusted, asked = s.opt.TrustOverride != nil && s.opt.TrustOverride(ctx), true
			}
			if trusted {
				it.lim = overrideLimit(req.Domain, d, o)
				s.metrics.overrides.WithLabelValues("applied").Inc()
				continue
			}
			s.metrics.overrides.WithLabelValues("ignored").Inc()
		}
		entries := entryBuf[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, rlsconfig.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		it.match = cfg.Lookup(req.Domain, entries)
		it.lim = it.match.Limit
		if it.lim != nil {
			for _, r := range it.lim.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
		}
	}
	now := s.opt.Now()
	// The usual call, of one descriptor, takes its response and that
	// descriptor's status in one allocation.
	var one *oneResponse
	if len(items) == 1 {
		one = new(oneResponse)
	}
	var checks []limiter.Check
	for i := range items {
		it := &items[i]
		l := it.lim
		switch {
		case l != nil && l.Name != "" && replaced[l.Name]:
			it.lim = nil
			fallthrough
		case l == nil:
			it.st = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
			s.metrics.noLimit.Inc()
			continue
		case l.Unlimited:
			it.st = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			s.metrics.unlimited.Inc()
			continue
		}
		it.applied = true
		ll := limit.Limit{Algorithm: l.Algorithm, Limit: int64(l.RequestsPerUnit), Window: l.Window, Burst: l.Burst}
		if l.RequestsPerUnit == 0 || it.cost > uint64(ll.Capacity()) {
			// Never admissible (a quota of 0 denies all, as in the
			// reference): answered here, nothing to count.
			it.st = s.status(one.status(), l, false, 0, windowReset(l, now))
			it.left = -1
			continue
		}
		ll.Key = counterKey(req.Domain, req.Descriptors[i].GetEntries(), it.match.Shared, l)
		it.check = len(checks)
		c := limiter.Check{Limit: ll, Cost: int64(it.cost), Shadow: true, Nodes: s.nodes()}
		if it.cost == 0 {
			// A look: over when one more hit would not fit. The
			// algorithms that keep members cannot look: they count 1.
			c.Cost, c.Peek = 1, !ll.Algorithm.Spec().Members
			if !c.Peek {
				it.cost = 1
			}
		}
		checks = append(checks, c)
	}
	if len(checks) == 1 {
		// Alone, a check may deny for real: a denial is then cached and
		// the next ones cost no Redis call. Several are counted as shadow
		// checks so that one denying does not undo the others.
		for i := range items {
			if items[i].check == 0 {
				checks[0].Shadow = items[i].lim.Shadow
			}
		}
	}
	if len(checks) > 0 {
		v, err := s.opt.Limiter.Decide(ctx, checks)
		if err != nil {
			s.log.Warn("rate limit decision failed", "domain", req.Domain, "err", err)
			if errors.Is(err, limiter.ErrUnavailable) {
				return nil, status.Error(codes.Unavailable, "rate limit store unavailable")
			}
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, status.Error(codes.Internal, "rate limit decision failed")
		}
		for i := range items {
			it := &items[i]
			if it.check < 0 {
				continue
			}
			o := v.Checks[it.check]
			it.st = s.status(one.status(), it.lim, o.Allowed, o.Remaining, o.ResetAfter)
			it.left = o.Remaining
		}
	}
	resp := newResponse(one, len(items))
	quota, quotaOver := 0, 0
	for i := range items {
		it := &items[i]
		resp.Statuses[i] = it.st
		if !it.applied {
			// Under QUOTA_MODE the reference counts a descriptor without a
			// limit (unmatched or replaced, not unlimited) as a quota
			// descriptor that passes: the call is then not over the limit.
			if s.opt.Quota && it.lim == nil {
				quota++
			}
			continue
		}
		over := it.st.Code == pb.RateLimitResponse_OVER_LIMIT
		if s.opt.Observer != nil {
			s.opt.Observer(Observation{Domain: req.Domain, Limit: it.lim, Hits: it.cost, Over: over, Remaining: it.left})
		}
		switch {
		case it.lim.Shadow && over:
			it.st.Code = pb.RateLimitResponse_OK
			s.metrics.shadowOver.Inc()
		case over:
			s.metrics.over.Inc()
		default:
			s.metrics.ok.Inc()
		}
		switch {
		case it.lim.Quota || s.opt.Quota:
			// A shadow quota limit is one that passes, as in the reference.
			quota++
			if over && !it.lim.Shadow {
				quotaOver++
			}
		case it.lim.Shadow:
		case over:
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
	}
	if quota > 0 && quota == quotaOver {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	resp.ResponseHeadersToAdd = s.headers(items)
	if s.opt.Shadow && resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		resp.OverallCode = pb.RateLimitResponse_OK
		s.metrics.globalShadow.Inc()
	}
	return resp, nil
}

func (s *Server) nodes() int {
	if s.opt.Nodes == nil {
		return 1
	}
	return max(1, s.opt.Nodes())
}

// responseBlock holds a response and, for the usual call of one
// descriptor, its list of statuses: one allocation instead of two.
type responseBlock struct {
	resp pb.RateLimitResponse
	one  [1]*pb.RateLimitResponse_DescriptorStatus
}

// oneResponse is a one-descriptor call's response and status together.
type oneResponse struct {
	resp responseBlock
	st   statusBlock
}

// status is where the call's status goes: nil (a new one) without a block.
func (o *oneResponse) status() *statusBlock {
	if o == nil {
		return nil
	}
	return &o.st
}

// newResponse is a response of n statuses, in one's block when not nil.
func newResponse(one *oneResponse, n int) *pb.RateLimitResponse {
	var b *responseBlock
	if one != nil {
		b = &one.resp
	} else {
		b = new(responseBlock)
	}
	b.resp.OverallCode = pb.RateLimitResponse_OK
	if n == 1 {
		b.resp.Statuses = b.one[:]
	} else {
		b.resp.Statuses = make([]*pb.RateLimitResponse_DescriptorStatus, n)
	}
	return &b.resp
}

// statusBlock holds a status and the messages it points to: one
// allocation instead of three.
type statusBlock struct {
	st    pb.RateLimitResponse_DescriptorStatus
	limit pb.RateLimitResponse_RateLimit
	reset durationpb.Duration
}

// status is one descriptor's answer, in b (a new block when nil).
func (s *Server) status(b *statusBlock, l *rlsconfig.Limit, allowed bool, remaining int64, reset time.Duration) *pb.RateLimitResponse_DescriptorStatus {
	if b == nil {
		b = new(statusBlock)
	}
	reset = max(reset, 0)
	b.limit.Name, b.limit.RequestsPerUnit, b.limit.Unit = l.Name, l.RequestsPerUnit, pbUnit(l.Unit)
	b.reset.Seconds, b.reset.Nanos = int64(reset/time.Second), int32(reset%time.Second)
	st := &b.st
	st.Code = pb.RateLimitResponse_OK
	st.CurrentLimit = &b.limit
	st.LimitRemaining = uint32(min(max(remaining, 0), math.MaxUint32))
	st.DurationUntilReset = &b.reset
	if !allowed {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
		st.LimitRemaining = 0
	}
	return st
}

// windowReset is when an epoch-aligned window of l ends (the reference's
// reset for every limit; the limiter's for fixed windows).
func windowReset(l *rlsconfig.Limit, now time.Time) time.Duration {
	w := l.Window.Milliseconds()
	if w <= 0 {
		return 0
	}
	ms := now.UnixMilli()
	return time.Duration(w-ms%w) * time.Millisecond
}

var units = map[rlsconfig.Unit]pb.RateLimitResponse_RateLimit_Unit{
	rlsconfig.Second: pb.RateLimitResponse_RateLimit_SECOND,
	rlsconfig.Minute: pb.RateLimitResponse_RateLimit_MINUTE,
	rlsconfig.Hour:   pb.RateLimitResponse_RateLimit_HOUR,
	rlsconfig.Day:    pb.RateLimitResponse_RateLimit_DAY,
	rlsconfig.Week:   pb.RateLimitResponse_RateLimit_WEEK,
	rlsconfig.Month:  pb.RateLimitResponse_RateLimit_MONTH,
	rlsconfig.Year:   pb.RateLimitResponse_RateLimit_YEAR,
}

// pbUnit is the API's unit; a window set by the extension has none
// (UNKNOWN: the window is in the RateLimit-Policy header's w).
func pbUnit(u rlsconfig.Unit) pb.RateLimitResponse_RateLimit_Unit { return units[u] }

func overrideLimit(domain string, d *rlv3.RateLimitDescriptor, o *rlv3.RateLimitDescriptor_RateLimitOverride) *rlsconfig.Limit {
	u := rlsconfig.UnitNone
	for k, v := range units {
		if int32(v) == int32(o.GetUnit()) {
			u = k
		}
	}
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range d.GetEntries() {
		b.WriteString("." + e.GetKey())
		if e.GetValue() != "" {
			b.WriteString("_" + e.GetValue())
		}
	}
	l := &rlsconfig.Limit{Path: b.String(), RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u, Algorithm: limit.FixedWindow, Window: u.Duration()}
	if u == rlsconfig.UnitNone {
		// An override without a known unit can never be admitted.
		l.RequestsPerUnit = 0
	}
	return l
}

// counterKey names the counter of one descriptor: its domain, entries
// (the shared pattern in place of a value for share_threshold wildcards)
// and the limit's algorithm and window, hashed so that any value (braces,
// any length) makes a valid limiter key.
func counterKey(domain string, entries []*rlv3.RateLimitDescriptor_Entry, shared []string, l *rlsconfig.Limit) string {
	var buf [512]byte
	b := buf[:0]
	write := func(s string) {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	write(domain)
	for i, e := range entries {
		write(e.GetKey())
		if i < len(shared) && shared[i] != "" {
			b = append(b, '*')
			write(shared[i])
			continue
		}
		b = append(b, '=')
		write(e.GetValue())
	}
	write(l.Algorithm.String())
	b = strconv.AppendInt(b, l.Window.Milliseconds(), 10)
	sum := sha256.Sum256(b)
	var out [4 + 32]byte
	copy(out[:], "rls:")
	hex.Encode(out[4:], sum[:16])
	return string(out[:])
}

// headers are the RateLimit fields for the response.
func (s *Server) headers(items []item) []*core.HeaderValue {
	switch s.opt.Headers {
	case HeadersOff:
		return nil
	case HeadersLegacy:
		// As the reference picks: the last descriptor over its limit that
		// is not a quota descriptor, else the first with the least
		// remaining (compared strictly, so a later tie never wins; quota
		// descriptors over theirs included).
		var pick *item
		least := uint32(math.MaxUint32)
		for i := range items {
			it := &items[i]
			if !it.applied {
				continue
			}
			if it.st.LimitRemaining < least {
				pick, least = it, it.st.LimitRemaining
			}
			if it.st.Code == pb.RateLimitResponse_OVER_LIMIT && !it.lim.Quota && !s.opt.Quota {
				pick, least = it, 0
			}
		}
		if pick == nil {
			return nil
		}
		return []*core.HeaderValue{
			{Key: s.opt.LegacyNames.Limit, Value: strconv.FormatUint(uint64(pick.lim.RequestsPerUnit), 10)},
			{Key: s.opt.LegacyNames.Remaining, Value: strconv.FormatUint(uint64(pick.st.LimitRemaining), 10)},
			{Key: s.opt.LegacyNames.Reset, Value: strconv.FormatInt(ceilSeconds(pick.st.DurationUntilReset.AsDuration()), 10)},
		}
	}
	var policy, state strings.Builder
	for i := range items {
		it := &items[i]
		if !it.applied || it.lim.Shadow {
			continue
		}
		name := it.lim.Name
		if name == "" {
			name = s.pathName(it.lim.Path)
		}
		if policy.Len() > 0 {
			policy.WriteString(", ")
			state.WriteString(", ")
		}
		q := sfString(name)
		policy.WriteString(q + ";q=" + strconv.FormatUint(uint64(it.lim.RequestsPerUnit), 10) + ";w=" + strconv.FormatInt(ceilSeconds(it.lim.Window), 10))
		state.WriteString(q + ";r=" + strconv.FormatUint(uint64(it.st.LimitRemaining), 10) + ";t=" + strconv.FormatInt(ceilSeconds(it.st.DurationUntilReset.AsDuration()), 10))
	}
	if policy.Len() == 0 {
		return nil
	}
	return []*core.HeaderValue{{Key: "RateLimit-Policy", Value: policy.String()}, {Key: "RateLimit", Value: state.String()}}
}

// pathName names a limit without a rate_limit name in the draft fields.
func (s *Server) pathName(path string) string {
	if s.opt.Names == NamesPath {
		return path
	}
	m := hmac.New(sha256.New, s.opt.NameSalt)
	m.Write([]byte(path))
	var sum [sha256.Size]byte
	var out [3 + 12]byte
	copy(out[:], "rl-")
	hex.Encode(out[3:], m.Sum(sum[:0])[:6])
	return string(out[:])
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// sfString quotes s as a structured-field string (RFC 8941): printable
// ASCII only, with '"' and '\' escaped; anything else becomes '_'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
