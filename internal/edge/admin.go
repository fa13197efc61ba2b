package edge

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// adminHandler serves the admin port: never the public one. /metrics,
// /healthz and /readyz are open (scrapers and load balancers); /debug
// shows rules, client states and profiles, so it needs the admin token,
// and /debug/pprof also --pprof. There is no /debug/pprof/cmdline: no
// secret is on the command line, but nothing there needs to be shown.
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
	debug := http.NewServeMux()
	mux.Handle("/debug/", e.adminAuth(debug))
	debug.HandleFunc("GET /debug/rules", func(w http.ResponseWriter, _ *http.Request) {
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
	debug.HandleFunc("GET /debug/clients", e.bh.debugClients)
	if e.cfg.Pprof {
		debug.HandleFunc("GET /debug/pprof/", pprof.Index)
		debug.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		debug.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		debug.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// adminAuth lets a request through when it carries the admin token
// (Authorization: Bearer TOKEN, compared in constant time).
func (e *Edge) adminAuth(next http.Handler) http.Handler {
	want := []byte("Bearer " + e.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if e.cfg.AdminToken == "" {
			http.Error(w, "the /debug endpoints are off: start the edge with an admin token (EDGEGUARD_ADMIN_TOKEN or --admin-token-file)", http.StatusForbidden)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="edgeguard admin"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
