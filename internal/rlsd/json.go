package rlsd

import (
	"io"
	"log/slog"
	"net/http"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request (a RateLimitRequest of the largest
// size the service answers is far below it).
const maxJSONBody = 1 << 20

// jsonHandler is the reference's /json: POST a RateLimitRequest as
// protobuf JSON, get the RateLimitResponse as JSON, status 200 when OK,
// 429 when over the limit; 400 for a request that does not parse or that
// the service refuses.
func jsonHandler(svc pb.RateLimitServiceServer, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			log.Debug("json: reading the request", "err", err)
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		var req pb.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			log.Debug("json: parsing the request", "err", err)
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		resp, err := svc.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			log.Debug("json: request refused", "err", err)
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.OverallCode {
		case pb.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		case pb.RateLimitResponse_UNKNOWN:
			w.WriteHeader(http.StatusInternalServerError)
		}
		_, _ = w.Write(out)
	})
}
