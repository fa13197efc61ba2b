package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
)

// Tracing (--otlp-endpoint): OpenTelemetry spans exported over OTLP/HTTP,
// one trace per sampled request: edge.request, with shedder.wait,
// limiter.decide and origin.request under it. The W3C trace context is
// taken from trusted peers only (anyone else's is not a parent, and is
// replaced before the origin sees it) and passed on to the origin.

// tracing is the edge's tracer; nil when off.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func (e *Pipeline) startTracing() error {
	if e.cfg.OTLPEndpoint == "" {
		return nil
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(e.cfg.OTLPEndpoint))
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "edgeguard-edge"),
		attribute.String("service.version", buildinfo.Get().Version),
		attribute.String("edgeguard.region", e.cfg.Region),
		attribute.String("edgeguard.pop", e.cfg.PoP),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(e.cfg.TraceSampleRatio))),
	)
	e.closers = append(e.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			e.log.Warn("tracing: spans not flushed at shutdown", "err", err)
		}
	})
	e.tracing = &tracing{tracer: tp.Tracer("github.com/edgeguard/edgeguard/internal/edge"), prop: propagation.TraceContext{}}
	return nil
}

// headerCarrier reads and writes a fasthttp request's header for the
// propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string      { return []string{"traceparent", "tracestate"} }

// begin starts the request's span: a child of a trusted peer's trace
// context, else a root. Untrusted trace context is dropped.
func (t *tracing) begin(ctx *fasthttp.RequestCtx, trusted bool) (context.Context, trace.Span) {
	parent := context.Background()
	if trusted {
		parent = t.prop.Extract(parent, headerCarrier{&ctx.Request.Header})
	} else {
		ctx.Request.Header.Del("traceparent")
		ctx.Request.Header.Del("tracestate")
	}
	return t.tracer.Start(parent, "edge.request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", string(ctx.Method())),
			attribute.String("url.path", string(ctx.Request.URI().PathOriginal())),
			attribute.String("server.address", string(ctx.Request.Header.Host())),
		))
}

// child starts a span under the request's; a no-op without tracing.
func (t *tracing) child(parent context.Context, name string) (context.Context, trace.Span) {
	if t == nil || parent == nil {
		return parent, trace.SpanFromContext(context.Background())
	}
	return t.tracer.Start(parent, name)
}

// inject writes the span's context into the request the origin receives.
func (t *tracing) inject(ctx context.Context, req *fasthttp.RequestHeader) {
	if t == nil || ctx == nil {
		return
	}
	t.prop.Inject(ctx, headerCarrier{req})
}

// endRequestSpan closes the request's span with what happened: the same
// outcome, decision, rules and limiter source as the access-log line.
func (e *Pipeline) endRequestSpan(span trace.Span, ctx *fasthttp.RequestCtx, outcome string, sc *scratch) {
	status := ctx.Response.StatusCode()
	rules, source := e.decidedBy(sc, nil)
	span.SetAttributes(
		attribute.Int("http.response.status_code", status),
		attribute.String("edgeguard.outcome", outcome),
		attribute.String("edgeguard.decision", decisionOf(outcome, sc)),
		attribute.StringSlice("edgeguard.rules", rules),
		attribute.String("edgeguard.limiter.source", source),
		attribute.String("edgeguard.tier", sc.tier.String()),
		attribute.String("client.address", clientString(sc)),
	)
	if status >= 500 {
		span.SetStatus(otelcodes.Error, outcome)
	}
	span.End()
}
