package testenv

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// scrapeRelay serves one target's /metrics uncompressed on a loopback
// port of its own: each GET /metrics asks the target without
// Accept-Encoding (so it answers identity) and copies the answer back.
type scrapeRelay struct {
	addr      string
	srv       *http.Server
	transport *http.Transport
	once      sync.Once
}

// startScrapeRelay starts a relay in front of target (host:port).
func startScrapeRelay(target string) (*scrapeRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// DisableCompression: the transport adds no Accept-Encoding: gzip.
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 2}
	client := &http.Client{Transport: tr}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		// The scrape's context: Prometheus giving up at its timeout
		// cancels the request to the target too.
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+target+"/metrics", nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if accept := r.Header.Get("Accept"); accept != "" {
			req.Header.Set("Accept", accept) // the exposition format
		}
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for _, h := range []string{"Content-Type", "Content-Encoding"} {
			if v := resp.Header.Get(h); v != "" {
				w.Header().Set(h, v)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	rl := &scrapeRelay{addr: ln.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, transport: tr}
	go func() {
		if err := rl.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = ln.Close()
		}
	}()
	return rl, nil
}

// close stops the relay. It is idempotent.
func (rl *scrapeRelay) close() {
	rl.once.Do(func() {
		_ = rl.srv.Close()
		rl.transport.CloseIdleConnections()
	})
}
