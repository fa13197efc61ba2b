package build

import (
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/pipeline"
)

// PipelineConfig is the request path's settings in cfg (package pipeline).
func PipelineConfig(c config.Config) pipeline.Config {
	return pipeline.Config{
		Region: c.Region, PoP: c.PoP,
		TrustedProxies:            c.TrustedProxies,
		IPv6Prefix:                c.IPv6Prefix,
		AllowUnderscoresInHeaders: c.AllowUnderscoresInHeaders,
		AllowMethods:              c.AllowMethods,
		DefaultHost:               c.DefaultHost,
		TLSCheckHost:              c.TLSCheckHost,
		MaxBodyBytes:              c.MaxBodyBytes,
		LegacyHeaders:             c.LegacyHeaders,
		AccessLog:                 c.AccessLog,
		AccessLogFormat:           c.AccessLogFormat,
		AccessLogSample:           c.AccessLogSample,
		OTLPEndpoint:              c.OTLPEndpoint,
		TraceSampleRatio:          c.TraceSampleRatio,
		RefusedMethod:             func(ctx *fasthttp.RequestCtx) string { return config.RefusedMethod(ctx.Method()) },
		UsableHost:                config.UsableHost,
	}
}
