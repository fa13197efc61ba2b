package rlsdiff_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/edgeguard/edgeguard/internal/rlsd"
	"github.com/edgeguard/edgeguard/internal/rlsdiff"
)

// The test binary doubles as `edge rls` when asked, so the harness runs
// the edge on both sides without building cmd/edge.
const asEdgeRLS = "RLSDIFF_TEST_AS_EDGE_RLS"

func TestMain(m *testing.M) {
	if os.Getenv(asEdgeRLS) == "1" {
		os.Exit(rlsd.Main(nil, os.Environ(), os.Stderr))
	}
	os.Exit(m.Run())
}

func edgeSide(name string, env ...string) rlsdiff.Command {
	return rlsdiff.Command{Name: name, Path: os.Args[0], Env: append([]string{asEdgeRLS + "=1", "EDGEGUARD_DRAIN_DELAY=0"}, env...)}
}

func run(t *testing.T, a, b rlsdiff.Command, only int) (rlsdiff.Summary, string) {
	t.Helper()
	sets, err := rlsdiff.Sets("testdata/reference")
	require.NoError(t, err)
	if only > 0 {
		sets = sets[:only]
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sum, err := rlsdiff.Run(ctx, rlsdiff.Options{Reference: a, Edge: b, Sets: sets, Out: &out, Verbose: true}) // a failure shows each difference
	require.NoError(t, err, out.String())
	return sum, out.String()
}

// TestSmokeEdgeAgainstItself runs the whole harness with the edge on both
// sides: every set is served alike and every call answered alike. The
// sets are found as in a reference checkout (a directory set, each
// test/config file alone, the example set again with header fields,
// QUOTA_MODE and SHADOW_MODE), and a set both refuse is compared too.
func TestSmokeEdgeAgainstItself(t *testing.T) {
	sum, out := run(t, edgeSide("one"), edgeSide("two"), 0)
	require.Equal(t, 6, sum.Sets, out)
	require.Greater(t, sum.Cases, 200, out)
	require.Equal(t, sum.Cases, sum.Same, out)
	require.Zero(t, sum.Undocumented, out)
	require.Contains(t, out, "set test/config/bad_unit.yaml: one refused, two refused")
	require.Contains(t, out, "set test/config/quota.yaml: one accepted, two accepted")
}

// TestSmokeFindsDifferences: the same harness with one side started with
// SHADOW_MODE (every over-limit answer turned OK), on the example set,
// reports the calls
// that cross a limit as undocumented differences, with both answers.
func TestSmokeFindsDifferences(t *testing.T) {
	sum, out := run(t, edgeSide("plain"), edgeSide("shadow", "SHADOW_MODE=true"), 1)
	require.Positive(t, sum.Undocumented, out)
	require.Contains(t, out, "UNDOCUMENTED: overall_code")
	require.Regexp(t, `plain: +OVER_LIMIT`, out)
	require.Regexp(t, `shadow: +OK`, out)
}

func status1(code pb.RateLimitResponse_Code, remaining uint32, reset time.Duration) *pb.RateLimitResponse {
	return &pb.RateLimitResponse{OverallCode: code, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{
		Code: code, CurrentLimit: &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: pb.RateLimitResponse_RateLimit_MINUTE},
		LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset),
	}}}
}

func TestCompare(t *testing.T) {
	withHeaders := func(r *pb.RateLimitResponse, kv ...string) *pb.RateLimitResponse {
		for i := 0; i+1 < len(kv); i += 2 {
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
		}
		return r
	}
	for _, tc := range []struct {
		name string
		a, b rlsdiff.Answer
		want []string
	}{
		{"alike within the reset tolerance", rlsdiff.Answer{Resp: status1(0, 3, 10*time.Second)}, rlsdiff.Answer{Resp: status1(0, 3, 9*time.Second)}, nil},
		{"reset too far apart", rlsdiff.Answer{Resp: status1(0, 3, 10*time.Second)}, rlsdiff.Answer{Resp: status1(0, 3, 7*time.Second)}, []string{"status[0].duration_until_reset"}},
		{"remaining and code", rlsdiff.Answer{Resp: status1(1, 1, time.Second)}, rlsdiff.Answer{Resp: status1(2, 0, time.Second)}, []string{"overall_code", "status[0].code", "status[0].limit_remaining"}},
		{"one error", rlsdiff.Answer{Err: status.Error(codes.Unknown, "x")}, rlsdiff.Answer{Resp: status1(1, 1, time.Second)}, []string{"error"}},
		{"same error code, other message", rlsdiff.Answer{Err: status.Error(codes.Unknown, "x")}, rlsdiff.Answer{Err: status.Error(codes.Unknown, "y")}, nil},
		{"header names in any case, reset within the tolerance",
			rlsdiff.Answer{Resp: withHeaders(status1(1, 1, time.Second), "RateLimit-Remaining", "1", "RateLimit-Reset", "10")},
			rlsdiff.Answer{Resp: withHeaders(status1(1, 1, time.Second), "ratelimit-reset", "9", "ratelimit-remaining", "1")}, nil},
		{"a remaining field is exact",
			rlsdiff.Answer{Resp: withHeaders(status1(1, 1, time.Second), "RateLimit-Remaining", "1")},
			rlsdiff.Answer{Resp: withHeaders(status1(1, 1, time.Second), "RateLimit-Remaining", "2")}, []string{"response_headers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range rlsdiff.Compare(tc.a, tc.b) {
				got = append(got, d.String())
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestDocumentedInEnvoyMD: every difference the harness accepts is named
// in docs/envoy.md by the words the list gives.
func TestDocumentedInEnvoyMD(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(b)), " ")
	for _, d := range rlsdiff.Documented {
		require.Contains(t, doc, d.Doc, "difference %s", d.ID)
		require.NotEmpty(t, d.Reason, d.ID)
	}
}
