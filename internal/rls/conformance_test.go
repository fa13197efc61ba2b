package rls_test

import (
	"context"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// The conformance suite: envoyproxy/ratelimit's documented behaviour,
// asked of the real gRPC server through go-control-plane's client, the
// limiter counting in real Redis (standalone and Cluster).

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (s *service) ask(t *testing.T, domain string, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	return s.askN(t, domain, 0, ds...)
}

func (s *service) askN(t *testing.T, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	require.NoError(t, err)
	require.Len(t, r.Statuses, len(ds), "one status per descriptor, in order")
	return r
}

// each runs f against standalone Redis, a Redis Cluster and the memory
// store (the fallback's).
func each(t *testing.T, doc string, opts rls.Options, f func(t *testing.T, s *service)) {
	for _, name := range []string{"standalone", "cluster", "memory"} {
		t.Run(name, func(t *testing.T) {
			s := newService(t, setup{store: stores(t)[name](t), doc: doc, opts: opts})
			// A test's asks fall in one window of a minute or longer: a
			// minute's end is also an hour's and a day's.
			testenv.EarlyInWindow(time.Minute, 5*time.Second)
			f(t, s)
		})
	}
}

// TestConformanceReferenceConfig: the documented example configuration
// (testdata shaped like the reference's README examples), loaded from a
// directory as the reference loads its runtime directory.
func TestConformanceReferenceConfig(t *testing.T) {
	for _, name := range []string{"standalone", "cluster"} {
		t.Run(name, func(t *testing.T) {
			s := newService(t, setup{store: stores(t)[name](t), dir: "../../pkg/rlsconfig/testdata"})
			testenv.EarlyInWindow(time.Minute, 5*time.Second) // as in each
			marketing := desc("message_type", "marketing", "to_number", "2061111111")
			number := desc("to_number", "2061111111")

			// Nested descriptors and several descriptors in one call: each
			// counted on its own, the overall code their OR.
			for i := range 5 {
				r := s.ask(t, "messaging", marketing, number)
				require.Equal(t, ok, r.OverallCode)
				require.Equal(t, ok, r.Statuses[0].Code)
				require.EqualValues(t, 4-i, r.Statuses[0].LimitRemaining)
				require.EqualValues(t, 5, r.Statuses[0].CurrentLimit.RequestsPerUnit)
				require.Equal(t, pb.RateLimitResponse_RateLimit_DAY, r.Statuses[0].CurrentLimit.Unit)
				require.EqualValues(t, 99-i, r.Statuses[1].LimitRemaining)
			}
			r := s.ask(t, "messaging", marketing, number)
			require.Equal(t, over, r.OverallCode)
			require.Equal(t, over, r.Statuses[0].Code)
			require.Zero(t, r.Statuses[0].LimitRemaining)
			require.Equal(t, ok, r.Statuses[1].Code)
			require.EqualValues(t, 94, r.Statuses[1].LimitRemaining, "the descriptor within its limit is counted although another is over")
			require.Less(t, offAligned(r.Statuses[0].DurationUntilReset.AsDuration(), 24*time.Hour), 2*time.Second, "a day window ends at the epoch-aligned day's end")
			// Another number has its own counter.
			r = s.ask(t, "messaging", desc("message_type", "marketing", "to_number", "2062222222"))
			require.Equal(t, ok, r.OverallCode)
			require.EqualValues(t, 4, r.Statuses[0].LimitRemaining)

			// Most specific match: key and value before key; quota 0 denies all.
			r = s.ask(t, "messaging", desc("remote_address", "50.0.0.5"))
			require.Equal(t, over, r.OverallCode)
			require.EqualValues(t, 0, r.Statuses[0].CurrentLimit.RequestsPerUnit)
			r = s.ask(t, "messaging", desc("remote_address", "50.0.0.1"))
			require.Equal(t, ok, r.OverallCode)
			require.EqualValues(t, 10, r.Statuses[0].CurrentLimit.RequestsPerUnit)

			// Depth must match: no limit, answered OK without a limit.
			r = s.ask(t, "messaging", desc("key", "value", "subkey", "subvalue"))
			require.Equal(t, ok, r.OverallCode)
			require.Nil(t, r.Statuses[0].CurrentLimit)

			// Unlimited: OK, remaining MaxUint32, never counted.
			for range 3 {
				r = s.ask(t, "messaging", desc("ldap", "cn=x"))
				require.Equal(t, ok, r.Statuses[0].Code)
				require.EqualValues(t, uint32(math.MaxUint32), r.Statuses[0].LimitRemaining)
				require.Nil(t, r.Statuses[0].CurrentLimit)
			}

			// Unknown domain: every descriptor OK.
			r = s.ask(t, "nobody", desc("a", "b"), desc("c", "d"))
			require.Equal(t, ok, r.OverallCode)
			require.Equal(t, ok, r.Statuses[1].Code)
		})
	}
}

func TestConformanceShadowMode(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: user
        value: user-b
        rate_limit: {unit: hour, requests_per_unit: 2}
`
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		a, b := desc("service", "auth", "user", "user-a"), desc("service", "auth", "user", "user-b")
		for range 2 {
			require.Equal(t, ok, s.ask(t, "d", a, b).OverallCode)
		}
		r := s.ask(t, "d", a, b)
		require.Equal(t, over, r.OverallCode, "user-b is enforced")
		require.Equal(t, ok, r.Statuses[0].Code, "shadow mode answers OK over the limit")
		require.Zero(t, r.Statuses[0].LimitRemaining)
		require.Equal(t, over, r.Statuses[1].Code)
		r = s.ask(t, "d", a)
		require.Equal(t, ok, r.OverallCode)
		require.Zero(t, r.Statuses[0].LimitRemaining, "still counted")
	})
}

func TestConformanceReplaces(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: hour}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: hour
`
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		specific, replacing := desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")
		for i := range 7 {
			r := s.ask(t, "d", specific, replacing)
			require.Equal(t, ok, r.OverallCode, "call %d: the 5/hour limit is replaced", i)
			require.Nil(t, r.Statuses[0].CurrentLimit, "the replaced limit is not applied")
			require.EqualValues(t, 9-i, r.Statuses[1].LimitRemaining)
		}
		r := s.ask(t, "d", specific)
		require.EqualValues(t, 4, r.Statuses[0].LimitRemaining, "the replaced limit was not counted")
	})
}

func TestConformanceWildcards(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		require.EqualValues(t, 2, s.ask(t, "d", desc("path", "/files/a.pdf")).Statuses[0].LimitRemaining)
		require.EqualValues(t, 1, s.ask(t, "d", desc("path", "/files/b.csv")).Statuses[0].LimitRemaining, "share_threshold: one counter for every match")
		require.EqualValues(t, 1, s.ask(t, "d", desc("path", "/api/a")).Statuses[0].LimitRemaining)
		require.EqualValues(t, 1, s.ask(t, "d", desc("path", "/api/b")).Statuses[0].LimitRemaining, "without it: a counter per value")
		require.Equal(t, ok, s.ask(t, "d", desc("path", "/api/a")).OverallCode)
		require.Equal(t, over, s.ask(t, "d", desc("path", "/api/a")).OverallCode)
		require.Nil(t, s.ask(t, "d", desc("path", "/other")).Statuses[0].CurrentLimit)
	})
}

func TestConformanceHitsAddend(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		r := s.askN(t, "d", 3, desc("k", "a"))
		require.EqualValues(t, 7, r.Statuses[0].LimitRemaining, "the request's hits_addend")
		d := desc("k", "a")
		d.HitsAddend = wrapperspb.UInt64(5)
		r = s.askN(t, "d", 3, d)
		require.EqualValues(t, 2, r.Statuses[0].LimitRemaining, "a descriptor's hits_addend wins")
		r = s.askN(t, "d", 3, desc("k", "a"))
		require.Equal(t, over, r.OverallCode, "3 more do not fit in 2")
		require.EqualValues(t, 0, r.Statuses[0].LimitRemaining)
		r = s.askN(t, "d", 11, desc("k", "b"))
		require.Equal(t, over, r.OverallCode, "more than the limit never fits")
		r = s.askN(t, "d", 0, desc("k", "b"))
		require.EqualValues(t, 9, r.Statuses[0].LimitRemaining, "hits_addend 0 counts 1")
	})
}

// offAligned is how far a reported time until reset is from the end of the
// epoch-aligned window of length w that holds now (a boundary passed since
// the answer counts as no distance).
func offAligned(reset, w time.Duration) time.Duration {
	want := w - time.Duration(time.Now().UnixMilli()%w.Milliseconds())*time.Millisecond
	d := (reset - want) % w
	if d < 0 {
		d += w
	}
	return min(d, w-d)
}

// TestConformanceUnitsAndBoundaries: every unit from second to year
// reports its unit and ends its window where the reference's does (epoch
// aligned: unit − now mod unit); a window's end gives the quota back.
func TestConformanceUnitsAndBoundaries(t *testing.T) {
	units := []struct {
		name string
		unit pb.RateLimitResponse_RateLimit_Unit
		len  time.Duration
	}{
		{"second", pb.RateLimitResponse_RateLimit_SECOND, time.Second},
		{"minute", pb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
		{"hour", pb.RateLimitResponse_RateLimit_HOUR, time.Hour},
		{"day", pb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
		{"week", pb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
		{"month", pb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
		{"year", pb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
	}
	var doc strings.Builder
	doc.WriteString("domain: d\ndescriptors:\n")
	for _, u := range units {
		doc.WriteString("  - key: per\n    value: " + u.name + "\n    rate_limit: {unit: " + u.name + ", requests_per_unit: 2}\n")
	}
	each(t, doc.String(), rls.Options{}, func(t *testing.T, s *service) {
		for _, u := range units {
			r := s.ask(t, "d", desc("per", u.name))
			st := r.Statuses[0]
			require.Equal(t, u.unit, st.CurrentLimit.Unit, u.name)
			require.EqualValues(t, 1, st.LimitRemaining, u.name)
			got := st.DurationUntilReset.AsDuration()
			require.LessOrEqual(t, got, u.len, u.name)
			if u.len > time.Second {
				require.Less(t, offAligned(got, u.len), 2*time.Second, "%s: epoch-aligned window end", u.name)
			}
		}
		// The boundary: a per-second limit spent is back once the reset
		// the service announced has passed.
		var r *pb.RateLimitResponse
		for range 10 { // a boundary may pass between calls: spend the new window
			if r = s.ask(t, "d", desc("per", "second")); r.OverallCode == over {
				break
			}
		}
		require.Equal(t, over, r.OverallCode)
		reset := r.Statuses[0].DurationUntilReset.AsDuration()
		require.Positive(t, reset)
		require.LessOrEqual(t, reset, time.Second)
		time.Sleep(reset + 20*time.Millisecond) // kept: the window ends on the clock, no event marks it
		r = s.ask(t, "d", desc("per", "second"))
		require.Equal(t, ok, r.OverallCode, "a new window")
		require.EqualValues(t, 1, r.Statuses[0].LimitRemaining)
	})
}

func TestConformanceOverridesAndHeaders(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: k
    rate_limit: {name: per-k, unit: hour, requests_per_unit: 10}
`
	override := func() *rlv3.RateLimitDescriptor {
		d := desc("k", "o")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		return d
	}
	t.Run("untrusted", func(t *testing.T) {
		s := newService(t, setup{store: stores(t)["standalone"](t), doc: doc, opts: rls.Options{Headers: rls.HeadersDraft}})
		r := s.ask(t, "d", override())
		require.EqualValues(t, 10, r.Statuses[0].CurrentLimit.RequestsPerUnit, "an untrusted caller's override is ignored")
		require.Equal(t, []*core.HeaderValue{
			{Key: "RateLimit-Policy", Value: `"per-k";q=10;w=3600`},
			{Key: "RateLimit", Value: `"per-k";r=9;t=` + r.ResponseHeadersToAdd[1].Value[len(`"per-k";r=9;t=`):]},
		}, headersOf(r))
	})
	t.Run("trusted", func(t *testing.T) {
		s := newService(t, setup{store: stores(t)["cluster"](t), doc: doc, opts: rls.Options{TrustOverride: rls.TrustFrom([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})}})
		r := s.ask(t, "d", override())
		require.EqualValues(t, 1, r.Statuses[0].CurrentLimit.RequestsPerUnit)
		require.Equal(t, pb.RateLimitResponse_RateLimit_HOUR, r.Statuses[0].CurrentLimit.Unit)
		require.Equal(t, ok, r.OverallCode)
		require.Equal(t, over, s.ask(t, "d", override()).OverallCode)
		require.Equal(t, ok, s.ask(t, "d", desc("k", "o")).OverallCode, "the override's counter is its own")
	})
	t.Run("legacy headers", func(t *testing.T) {
		s := newService(t, setup{store: stores(t)["standalone"](t), doc: doc, opts: rls.Options{Headers: rls.HeadersLegacy}})
		h := headersOf(s.askN(t, "d", 4, desc("k", "x")))
		require.Len(t, h, 3)
		require.Equal(t, "RateLimit-Limit", h[0].Key)
		require.Equal(t, "10", h[0].Value)
		require.Equal(t, "6", h[1].Value)
	})
	t.Run("global shadow", func(t *testing.T) {
		s := newService(t, setup{store: stores(t)["standalone"](t), doc: doc, opts: rls.Options{Shadow: true}})
		r := s.askN(t, "d", 11, desc("k", "x"))
		require.Equal(t, ok, r.OverallCode)
		require.Equal(t, over, r.Statuses[0].Code)
	})
}

func headersOf(r *pb.RateLimitResponse) []*core.HeaderValue {
	out := make([]*core.HeaderValue, len(r.ResponseHeadersToAdd))
	for i, h := range r.ResponseHeadersToAdd {
		out[i] = &core.HeaderValue{Key: h.Key, Value: h.Value}
	}
	return out
}

func TestConformanceErrors(t *testing.T) {
	s := newService(t, setup{store: stores(t)["standalone"](t), doc: "domain: d\ndescriptors: []\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("a", "b")}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "rate limit domain must not be empty")
	_, err = s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "rate limit descriptor list must not be empty")
	// A caller asking for more work than any Envoy sends is refused before
	// anything is counted.
	many := make([]*rlv3.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("a", "b")
	}
	_, err = s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: many})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "at most 256")
	wide := &rlv3.RateLimitDescriptor{}
	for range rls.MaxEntries + 1 {
		wide.Entries = append(wide.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	_, err = s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{wide}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: many[:rls.MaxDescriptors]})
	require.NoError(t, err, "at the bound")
}

// TestConformanceQuotaMode: quota descriptors make the request over the
// limit only when every one of them is over.
func TestConformanceQuotaMode(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		q1, q2 := desc("q1", "a"), desc("q2", "a")
		require.Equal(t, ok, s.ask(t, "d", q1, q2).OverallCode)
		r := s.ask(t, "d", q1, q2)
		require.Equal(t, over, r.Statuses[0].Code)
		require.Equal(t, ok, r.OverallCode, "one quota left")
		r = s.ask(t, "d", q1, q2)
		require.Equal(t, over, r.Statuses[1].Code)
		require.Equal(t, over, r.OverallCode, "every quota over")
	})
}

// TestConformanceGlobalQuotaMode: under QUOTA_MODE the reference counts
// a descriptor without a limit (unmatched) as a quota descriptor that
// passes, and a shadow limit as one that passes; an unlimited one is no
// quota descriptor. So only the calls whose every counted descriptor is
// over are over the limit.
func TestConformanceGlobalQuotaMode(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: q
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: u
    rate_limit: {unlimited: true}
`
	each(t, doc, rls.Options{Quota: true}, func(t *testing.T, s *service) {
		q := desc("q", "a")
		require.Equal(t, ok, s.ask(t, "d", q).OverallCode)
		require.Equal(t, over, s.ask(t, "d", q).OverallCode, "the one quota is over")
		r := s.ask(t, "d", q, desc("nomatch", "x"))
		require.Equal(t, over, r.Statuses[0].Code)
		require.Equal(t, ok, r.OverallCode, "an unmatched descriptor passes")
		r = s.ask(t, "d", q, desc("s", "x"))
		require.Equal(t, ok, r.Statuses[1].Code, "shadowed")
		require.Equal(t, ok, r.OverallCode, "a shadow limit passes")
		r = s.ask(t, "d", q, desc("u", "x"))
		require.Equal(t, over, r.OverallCode, "an unlimited descriptor is no quota descriptor")
	})
}

// TestConformanceJoinedKeys: the reference finds a descriptor by the
// string key_value, so an entry whose key and value split that string
// elsewhere gets its limit; --rls-strict-match (rlsconfig.StrictMatch)
// tells them apart.
func TestConformanceJoinedKeys(t *testing.T) {
	doc := `domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
`
	split := desc("source_cluster", "proxy")
	split.Entries = append(split.Entries, desc("destination", "cluster_mock").Entries...)
	each(t, doc, rls.Options{}, func(t *testing.T, s *service) {
		r := s.ask(t, "rl", split)
		require.Equal(t, ok, r.OverallCode)
		require.NotNil(t, r.Statuses[0].CurrentLimit, "the joined string names the descriptor")
		require.EqualValues(t, 1, r.Statuses[0].CurrentLimit.RequestsPerUnit)
		require.Equal(t, pb.RateLimitResponse_RateLimit_MINUTE, r.Statuses[0].CurrentLimit.Unit)
		require.Equal(t, over, s.ask(t, "rl", split).OverallCode)
		// The counter is named after the request's entries, each key and
		// value apart: the other spelling counts on its own (the
		// reference's cache key joins them; docs/envoy.md).
		joined := desc("source_cluster", "proxy", "destination_cluster", "mock")
		require.Equal(t, ok, s.ask(t, "rl", joined).OverallCode)
		require.Equal(t, over, s.ask(t, "rl", joined).OverallCode)
	})
	t.Run("strict", func(t *testing.T) {
		s := newService(t, setup{store: stores(t)["standalone"](t), doc: doc, match: []rlsconfig.Option{rlsconfig.StrictMatch()}})
		for range 3 {
			r := s.ask(t, "rl", split)
			require.Equal(t, ok, r.OverallCode)
			require.Nil(t, r.Statuses[0].CurrentLimit, "no limit for a different key")
		}
	})
}

// TestConformanceEmptyDirectory: an empty configuration directory is
// served, every descriptor answered OK without a limit, as the reference
// serves it; a document added later applies at the next reload.
func TestConformanceEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	s := newService(t, setup{store: stores(t)["standalone"](t), dir: dir})
	r := s.ask(t, "d", desc("k", "v"))
	require.Equal(t, ok, r.OverallCode)
	require.Nil(t, r.Statuses[0].CurrentLimit)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644))
	require.NoError(t, s.srv.Reload(dir, false))
	require.Equal(t, ok, s.ask(t, "d", desc("k", "v")).OverallCode)
	require.Equal(t, over, s.ask(t, "d", desc("k", "v")).OverallCode)
	require.ErrorIs(t, s.srv.Reload(filepath.Join(dir, "missing"), false), os.ErrNotExist, "a directory that does not exist is refused")
	require.Equal(t, over, s.ask(t, "d", desc("k", "v")).OverallCode, "the configuration in force stays")
}

// TestConformanceLegacyHeadersPick: the legacy fields describe the
// descriptor the reference picks: the last one over its limit that is not
// a quota descriptor, else the first with the least remaining.
func TestConformanceLegacyHeadersPick(t *testing.T) {
	doc := `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	limitOf := func(r *pb.RateLimitResponse) string {
		h := headersOf(r)
		require.Len(t, h, 3)
		require.Equal(t, "RateLimit-Limit", h[0].Key)
		return h[0].Value + " remaining " + h[1].Value
	}
	each(t, doc, rls.Options{Headers: rls.HeadersLegacy}, func(t *testing.T, s *service) {
		q1, q2 := desc("service", "service_1"), desc("service", "service_2")
		require.Equal(t, "1 remaining 0", limitOf(s.ask(t, "rl", q1, q2)), "q1 has the least left")
		r := s.ask(t, "rl", q1, q2)
		require.Equal(t, []pb.RateLimitResponse_Code{over, ok}, []pb.RateLimitResponse_Code{r.Statuses[0].Code, r.Statuses[1].Code})
		require.Equal(t, "1 remaining 0", limitOf(r), "a tie at 0: the first wins")
		r = s.ask(t, "rl", q1, q2)
		require.Equal(t, over, r.OverallCode, "every quota over")
		require.Equal(t, "1 remaining 0", limitOf(r), "every quota over: still the first with the least")
		require.Equal(t, ok, s.askN(t, "rl", 5, desc("plain", "x")).Statuses[0].Code)
		r = s.askN(t, "rl", 1, q1, desc("plain", "x"))
		require.Equal(t, []pb.RateLimitResponse_Code{over, over}, []pb.RateLimitResponse_Code{r.Statuses[0].Code, r.Statuses[1].Code})
		require.Equal(t, "5 remaining 0", limitOf(r), "a plain descriptor over wins over a quota one")
	})
}

// TestConformanceHitsAddendZero: a descriptor's hits_addend of 0 looks
// without counting, as the reference's (GetHitsAddends: a set
// per-descriptor hits_addend is used as is, 0 included): the status says
// whether the descriptor is over its limit, what remains and when it
// resets, and nothing is counted; the Observer sees it with 0 hits (the
// reference adds the look's 0 hits to every stat). The request's
// hits_addend of 0 still means 1 (TestConformanceHitsAddend).
func TestConformanceHitsAddendZero(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 3}
`
	var mu sync.Mutex
	var seen []rls.Observation
	opts := rls.Options{Observer: func(o rls.Observation) {
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
	}}
	look := func(kv ...string) *rlv3.RateLimitDescriptor {
		d := desc(kv...)
		d.HitsAddend = wrapperspb.UInt64(0)
		return d
	}
	each(t, doc, opts, func(t *testing.T, s *service) {
		mu.Lock()
		seen = nil
		mu.Unlock()
		for range 5 { // never counted: no key, the whole limit
			r := s.askN(t, "d", 4, look("k", "a")) // the descriptor's 0 wins over the request's 4
			require.Equal(t, ok, r.OverallCode)
			st := r.Statuses[0]
			require.Equal(t, ok, st.Code)
			require.EqualValues(t, 3, st.LimitRemaining)
			require.EqualValues(t, 3, st.CurrentLimit.RequestsPerUnit)
			require.Equal(t, pb.RateLimitResponse_RateLimit_DAY, st.CurrentLimit.Unit)
			require.Less(t, offAligned(st.DurationUntilReset.AsDuration(), 24*time.Hour), 2*time.Second)
		}
		mu.Lock()
		require.Len(t, seen, 5)
		for _, o := range seen {
			require.Zero(t, o.Hits, "a look counts no hit")
			require.False(t, o.Over)
			require.EqualValues(t, 3, o.Remaining)
		}
		mu.Unlock()

		// A look next to a counted descriptor: only the other is counted.
		r := s.ask(t, "d", look("k", "a"), desc("k", "b"))
		require.EqualValues(t, 3, r.Statuses[0].LimitRemaining)
		require.EqualValues(t, 2, r.Statuses[1].LimitRemaining)
		require.EqualValues(t, 2, s.ask(t, "d", look("k", "b")).Statuses[0].LimitRemaining)

		// Counted hits are seen, the looks leave them as they are.
		require.EqualValues(t, 1, s.askN(t, "d", 2, desc("k", "a")).Statuses[0].LimitRemaining)
		for range 5 {
			r := s.ask(t, "d", look("k", "a"))
			require.Equal(t, ok, r.OverallCode)
			require.EqualValues(t, 1, r.Statuses[0].LimitRemaining)
		}
		require.Equal(t, ok, s.ask(t, "d", desc("k", "a")).OverallCode, "the last hit of the limit")
		// At the limit, with nothing over it: the reference answers OK
		// with 0 remaining (its count is not past the limit); edgeguard's
		// count never passes the limit, so a look answers over as soon
		// as the next hit would not fit (docs/envoy.md).
		r = s.ask(t, "d", look("k", "a"))
		require.Equal(t, over, r.OverallCode)
		require.Zero(t, r.Statuses[0].LimitRemaining)
		// Past it (a hit denied): over, as the reference answers.
		require.Equal(t, over, s.ask(t, "d", desc("k", "a")).OverallCode)
		for range 3 {
			r = s.ask(t, "d", look("k", "a"))
			require.Equal(t, over, r.OverallCode)
			st := r.Statuses[0]
			require.Equal(t, over, st.Code)
			require.Zero(t, st.LimitRemaining)
			require.EqualValues(t, 3, st.CurrentLimit.RequestsPerUnit)
			require.Less(t, offAligned(st.DurationUntilReset.AsDuration(), 24*time.Hour), 2*time.Second)
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		require.Zero(t, last.Hits)
		require.True(t, last.Over)
		// The looks counted nothing on the other key either.
		require.EqualValues(t, 1, s.ask(t, "d", desc("k", "b")).Statuses[0].LimitRemaining)
	})
}
