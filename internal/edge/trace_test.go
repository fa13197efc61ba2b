package edge

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// otlpReceiver is an OTLP/HTTP traces endpoint in the test process.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL + "/v1/traces"
}

// trace returns the spans of one trace by name, once want of them arrived.
func (r *otlpReceiver) trace(t *testing.T, traceID []byte, want int) map[string]*tracepb.Span {
	t.Helper()
	var got map[string]*tracepb.Span
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		got = map[string]*tracepb.Span{}
		for _, s := range r.spans {
			if string(s.TraceId) == string(traceID) {
				got[s.Name] = s
			}
		}
		return len(got) >= want
	}, 10*time.Second, 10*time.Millisecond)
	return got
}

func attr(s *tracepb.Span, k string) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			if v := a.Value.GetStringValue(); v != "" {
				return v
			}
			return a.Value.String()
		}
	}
	return ""
}

// A sampled request leaves a trace with the edge's request, its worker
// wait, its limiter decision and its origin call; a trusted peer's trace
// context is followed and passed on to the origin, anyone else's is not.
func TestTracing(t *testing.T) {
	waiting(t)
	recv, url := startOTLPReceiver(t)
	r := startEdge(t, perIP, func(c *config.Config) {
		c.OTLPEndpoint, c.TraceSampleRatio = url, 1
		c.TrustedProxies = trust.Set{mustPrefix("127.0.0.2/32")}
	})
	const parentTrace, parentSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	tp := "00-" + parentTrace + "-" + parentSpan + "-01"

	resp, body := dialFrom(t, "127.0.0.2", r.Addr()).do(t, "GET /traced HTTP/1.1\r\nHost: a.example\r\ntraceparent: "+tp+"\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	traceID, _ := hex.DecodeString(parentTrace)
	spans := recv.trace(t, traceID, 4)
	req := spans["edge.request"]
	require.Equal(t, parentSpan, hex.EncodeToString(req.ParentSpanId), "a trusted peer's context is the parent")
	for _, name := range []string{"shedder.wait", "limiter.decide", "origin.request"} {
		require.Contains(t, spans, name)
		require.Equal(t, req.SpanId, spans[name].ParentSpanId, name)
	}
	require.Equal(t, "proxied", attr(req, "edgeguard.outcome"))
	require.Equal(t, "read", attr(req, "edgeguard.tier"))
	origin := echoed(t, body)["headers"]
	require.Contains(t, origin, "Traceparent: 00-"+parentTrace+"-"+hex.EncodeToString(spans["origin.request"].SpanId)+"-01", "the origin continues the trace from the edge's origin call")

	// An untrusted client's trace context is neither parent nor passed on.
	resp, body = dialFrom(t, "127.0.0.1", r.Addr()).do(t, "GET /untrusted HTTP/1.1\r\nHost: a.example\r\ntraceparent: "+tp+"\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	origin = echoed(t, body)["headers"]
	require.NotContains(t, origin, parentTrace)
	require.Contains(t, origin, "Traceparent: 00-", "the edge's own trace reaches the origin")

	// A denial is traced too.
	codes(t, r, 4, "/deny")
	var denied *tracepb.Span
	require.Eventually(t, func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		for _, s := range recv.spans {
			if s.Name == "edge.request" && attr(s, "edgeguard.outcome") == "denied" {
				denied = s
			}
		}
		return denied != nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "/deny", attr(denied, "url.path"))
	// It says which rule denied it and where the answer came from, as the
	// access-log line does.
	require.Equal(t, "denied", attr(denied, "edgeguard.decision"))
	require.Contains(t, attr(denied, "edgeguard.rules"), `"per-ip"`)
	require.Contains(t, []string{"memory", "prefilter"}, attr(denied, "edgeguard.limiter.source"))
}
