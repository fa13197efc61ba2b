package edge

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// adminHandler serves the admin port: never the public one.
func (e *Edge) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{Registry: e.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := e.readiness()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body + "\n"))
	})
	mux.HandleFunc("GET /debug/rules", func(w http.ResponseWriter, _ *http.Request) {
		snap := e.rules.Load()
		var loaded time.Time
		if at := e.rulesAt.Load(); at != nil {
			loaded = *at
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Version  string               `json:"version"`
			LoadedAt time.Time            `json:"loaded_at"`
			Region   string               `json:"region"`
			PoP      string               `json:"pop"`
			Rules    []rules.CompiledRule `json:"rules"`
		}{snap.Version(), loaded, e.cfg.Region, e.cfg.PoP, snap.Rules()})
	})
	mux.HandleFunc("GET /debug/clients", e.bh.debugClients)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}
