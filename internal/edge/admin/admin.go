// Package admin is the admin port: metrics, health, readiness and the
// token-guarded debug pages (rules, client states, profiles).
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Config is what the admin port shows.
type Config struct {
	Registry *prometheus.Registry
	Ready    Readiness
	Rules    func() (snap *rules.Snapshot, loaded time.Time) // the rules in force
	Region   string
	PoP      string
	Clients  http.HandlerFunc // the behaviour layer's client states
	Token    string           // --admin-token: /debug needs it
	Pprof    bool
}

// newHandler serves the admin port: never the public one. /metrics,
// /healthz and /readyz are open (scrapers and load balancers); /debug
// shows rules, client states and profiles, so it needs the admin token,
// and /debug/pprof also --pprof. There is no /debug/pprof/cmdline: no
// secret is on the command line, but nothing there needs to be shown.
func newHandler(c Config) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.Registry, promhttp.HandlerOpts{Registry: c.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := c.Ready.Answer()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body + "\n"))
	})
	debug := http.NewServeMux()
	mux.Handle("/debug/", auth(c.Token, debug))
	debug.HandleFunc("GET /debug/rules", func(w http.ResponseWriter, _ *http.Request) {
		snap, loaded := c.Rules()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Version  string               `json:"version"`
			LoadedAt time.Time            `json:"loaded_at"`
			Region   string               `json:"region"`
			PoP      string               `json:"pop"`
			Rules    []rules.CompiledRule `json:"rules"`
		}{snap.Version(), loaded, c.Region, c.PoP, snap.Rules()})
	})
	debug.HandleFunc("GET /debug/clients", c.Clients)
	if c.Pprof {
		debug.HandleFunc("GET /debug/pprof/", pprof.Index)
		debug.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		debug.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		debug.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// auth lets a request through when it carries the admin token
// (Authorization: Bearer TOKEN, compared in constant time).
func auth(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if token == "" {
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
