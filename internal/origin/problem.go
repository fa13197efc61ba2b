package origin

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// problem is an RFC 9457 problem document. The bodies are marshalled once:
// an outage sends the same few bytes to every client, so there is no reason
// to build them per request.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

type cannedProblem struct {
	status     int
	retryAfter string // Retry-After, when the client should come back
	body       []byte
}

func newProblem(status int, detail string) cannedProblem {
	return newTypedProblem("about:blank", status, detail)
}

func newTypedProblem(typ string, status int, detail string) cannedProblem {
	body, err := json.Marshal(problem{
		Type:   typ,
		Title:  fasthttp.StatusMessage(status),
		Status: status,
		Detail: detail,
	})
	if err != nil {
		// Four plain fields cannot fail to marshal.
		panic(err)
	}
	return cannedProblem{status: status, body: body}
}

// Details are deliberately generic: origin error text names internal
// addresses, so it goes to the log and never to the client.
var (
	problemConnect  = newProblem(fasthttp.StatusBadGateway, "The origin could not be reached.")
	problemTLS      = newProblem(fasthttp.StatusBadGateway, "The origin's TLS certificate could not be verified, or its TLS handshake failed.")
	problemTimeout  = newProblem(fasthttp.StatusGatewayTimeout, "The origin did not answer in time.")
	problemTooLarge = newProblem(fasthttp.StatusBadGateway, "The origin response exceeded the size limit.")
	problemOther    = newProblem(fasthttp.StatusBadGateway, "The origin request failed.")
	// The edge's own connection pool is full: its capacity, not the
	// origin's failure, so 503 with Retry-After like the shedder's.
	problemNoFreeConns = func() cannedProblem {
		p := newTypedProblem("https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
			fasthttp.StatusServiceUnavailable, "Every connection to the origin is busy; retry later.")
		p.retryAfter = "1"
		return p
	}()
	problemRequestTooLarge = newProblem(fasthttp.StatusRequestEntityTooLarge, "The request body exceeds the size limit.")
	problemClientBody      = newProblem(fasthttp.StatusBadRequest, "The request body could not be read.")
)

func writeProblem(ctx *fasthttp.RequestCtx, p cannedProblem) {
	ctx.SetStatusCode(p.status)
	ctx.SetContentType("application/problem+json")
	// A shared cache in front of the edge must not keep serving a
	// transient gateway error.
	ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-store")
	if p.retryAfter != "" {
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, p.retryAfter)
	}
	ctx.SetBody(p.body)
}
