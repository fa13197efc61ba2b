package edgeguard

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/grafana/sobek"

	"github.com/edgeguard/edgeguard/loadtest/internal/ratelimit"
)

// response is what the extension reads of a k6 http response.
type response struct {
	status  int
	headers map[string]string
	body    []byte
	hasBody bool
}

func (mi *ModuleInstance) readResponse(v sobek.Value) (response, error) {
	if v == nil || sobek.IsUndefined(v) || sobek.IsNull(v) {
		return response{}, fmt.Errorf("want a response object, got %v", v)
	}
	obj := v.ToObject(mi.vu.Runtime())
	var r response
	if s := obj.Get("status"); s != nil {
		r.status = int(s.ToInteger())
	}
	if h := obj.Get("headers"); h != nil && !sobek.IsUndefined(h) && !sobek.IsNull(h) {
		switch m := h.Export().(type) {
		case map[string]string:
			r.headers = m
		case map[string]any:
			r.headers = make(map[string]string, len(m))
			for k, val := range m {
				r.headers[k] = fmt.Sprint(val)
			}
		default:
			return response{}, fmt.Errorf("response headers are %T, want an object", m)
		}
	}
	if b := obj.Get("body"); b != nil && !sobek.IsUndefined(b) && !sobek.IsNull(b) {
		r.hasBody = true
		switch body := b.Export().(type) {
		case string:
			r.body = []byte(body)
		case []byte:
			r.body = body
		case sobek.ArrayBuffer:
			r.body = body.Bytes()
		default:
			r.hasBody = false
		}
	}
	return r, nil
}

// jsFields is parseRateLimit's result as scripts see it.
type jsFields struct {
	Policies []ratelimit.Policy    `js:"policies" json:"policies"`
	Limits   []ratelimit.Limit     `js:"limits" json:"limits"`
	Retry    *float64              `js:"retryAfter" json:"retryAfter"` // seconds; null when absent
	Bad      []ratelimit.Malformed `js:"malformed" json:"malformed"`
}

// parse reads the fields and counts every malformed one.
func (mi *ModuleInstance) parse(r response) ratelimit.Fields {
	f := ratelimit.Parse(ratelimit.FromMap(r.headers), time.Now())
	for _, m := range f.Malformed {
		_ = mi.push(mi.metrics.malformed, 1, map[string]string{"field": m.Field})
	}
	return f
}

// ParseRateLimit is parseRateLimit(res) for scripts. The result is a plain
// object: {policies: [{name, q, w, qu}], limits: [{name, r, t}],
// retryAfter: seconds or null, malformed: [{field, reason}]}.
func (mi *ModuleInstance) ParseRateLimit(v sobek.Value) (sobek.Value, error) {
	r, err := mi.readResponse(v)
	if err != nil {
		return nil, fmt.Errorf("parseRateLimit: %w", err)
	}
	f := mi.parse(r)
	out := jsFields{Policies: f.Policies, Limits: f.Limits, Bad: f.Malformed}
	if f.HasRetryAfter {
		s := f.RetryAfter.Seconds()
		out.Retry = &s
	}
	return toJS(mi.vu.Runtime(), out)
}

// toJS hands a Go value to scripts as a plain JSON-shaped object (so names
// and nulls are exactly as documented).
func toJS(rt *sobek.Runtime, v any) (sobek.Value, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding result: %w", err)
	}
	var plain any
	if err := json.Unmarshal(b, &plain); err != nil {
		return nil, fmt.Errorf("decoding result: %w", err)
	}
	return rt.ToValue(plain), nil
}
