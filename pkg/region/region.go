// Package region is a deployment's regions as Consul sees them: where each
// region's documents live in Consul KV, how an edge watches them, how an
// operator pushes them (check-and-set plus a history entry, in one
// transaction), and which edges run where (the catalog).
//
// Every region is a Consul datacenter of the same name, and Consul KV is not
// replicated between datacenters, so each region's documents live in the
// region's own datacenter, under a prefix (default "edgeguard/"):
//
//	rules/global              the global rule set (YAML, rules schema v1)
//	rules/regions/<region>    the region's document: overrides rules by id,
//	                          switches them off with disabled: true
//	rules/canary/<region>/<pop>
//	                          a candidate region document the edges of <pop>
//	                          run instead while it exists (canary.go)
//	rules/canary-global/<region>/<pop>
//	                          a candidate global document the edges of <pop>
//	                          run instead of rules/global while it exists,
//	                          under the region document (canary.go)
//	shedder/<region>          the region's load shedder settings (JSON)
//	shedder/canary/<region>/<pop>
//	                          candidate shedder settings the edges of <pop>
//	                          run instead while it exists (canary.go)
//	hosts/<region>            the region's host table (YAML, hosts.go)
//	hosts/canary/<region>/<pop>
//	                          a candidate host table the edges of <pop> run
//	                          instead while it exists (canary.go)
//	enforcement/<region>      the region's enforcement switch: enforce, shadow,
//	                          or enforce a percentage of keys (JSON, enforcement.go)
//	history/<region>/<seq>    one entry per push or rollback (JSON); pushes
//	                          keep the newest N of each document
//	history/<region>/pruned   what that retention deleted (retention.go)
//	parts/<sha256>            a piece of a rules document too large for one
//	                          value; its key then holds a manifest (parts.go)
//	certs/<region>/<name>     a TLS certificate the region's edges serve (certs.go)
//	rls/<region>/<name>       a rate limit service document: envoyproxy/ratelimit
//	                          YAML, one domain (rls.go)
//	ticket-keys/<region>      the region's TLS session-ticket keys (tickets.go)
//	acme/<region>/…           the region's ACME account, certificates and locks
//	                          (certmagic's storage, internal/acmestore)
//
// One document per scope, so a push is atomic.
package region

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// DefaultPrefix is where edgeguard's keys start.
const DefaultPrefix = "edgeguard/"

// Service is the name edges register under in the Consul catalog.
const Service = "edgeguard-edge"

// RLSService is the name an edge's rate limit service (Envoy's gRPC API,
// --rls-listen) registers under: a service of its own, with a gRPC health
// check, so Envoy's clusters and Prometheus find it apart from the edges.
const RLSService = "edgeguard-rls"

// Layout names the keys under a prefix.
type Layout struct{ Prefix string }

// NewLayout normalizes prefix ("" is DefaultPrefix; a trailing / is added).
func NewLayout(prefix string) Layout {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Layout{Prefix: strings.TrimPrefix(prefix, "/")}
}

func (l Layout) Rules() string                    { return l.Prefix + "rules/" }
func (l Layout) GlobalRules() string              { return l.Prefix + "rules/global" }
func (l Layout) RegionRules(region string) string { return l.Prefix + "rules/regions/" + region }
func (l Layout) Shedder(region string) string     { return l.Prefix + "shedder/" + region }
func (l Layout) History(region string) string     { return l.Prefix + "history/" + region + "/" }
func (l Layout) Parts() string                    { return l.Prefix + "parts/" }
func (l Layout) ACME(region string) string        { return l.Prefix + "acme/" + region + "/" }

// HistoryPruned holds the region's Pruning record, next to the entries
// (whose names are all digits) so the same ACL rules cover it.
func (l Layout) HistoryPruned(region string) string { return l.History(region) + "pruned" }

// Errors callers act on (regionctl maps them to exit codes).
var (
	ErrConflict         = errors.New("conflict: the document changed since it was read (another push?)")
	ErrPermissionDenied = errors.New("permission denied by Consul ACLs")
	ErrUnreachable      = errors.New("consul unreachable")
	ErrUnknownRegion    = errors.New("unknown region")
	ErrNotFound         = errors.New("not found")
)

// classify turns a Consul client error into one of the named errors.
func classify(doing string, err error) error {
	if err == nil {
		return nil
	}
	var se api.StatusError
	switch {
	case errors.Is(err, ErrPermissionDenied), errors.Is(err, ErrUnknownRegion), errors.Is(err, ErrUnreachable):
		return err // already classified
	case errors.As(err, &se) && se.Code == http.StatusForbidden,
		strings.Contains(err.Error(), "Permission denied"), strings.Contains(err.Error(), "ACL not found"):
		return fmt.Errorf("%s: %w: %w", doing, ErrPermissionDenied, err)
	case strings.Contains(err.Error(), "No path to datacenter"):
		return fmt.Errorf("%s: %w: %w", doing, ErrUnknownRegion, err)
	case errors.As(err, &se):
		return fmt.Errorf("%s: %w", doing, err)
	}
	return fmt.Errorf("%s: %w: %w", doing, ErrUnreachable, err)
}

// RegionUnreachableError is a region's Consul servers out of reach of the
// agent a request went through: that agent answered, but could not forward
// the request to the region's datacenter (its servers down, no leader, the
// WAN cut). It matches ErrUnreachable with errors.Is.
type RegionUnreachableError struct {
	Region string
	Doing  string // what the request was for ("reading rules of us-east")
	Detail string // the agent's answer
}

func (e *RegionUnreachableError) Error() string {
	return fmt.Sprintf("%s: %v: the Consul servers of region %s did not answer the agent: %s", e.Doing, ErrUnreachable, e.Region, e.Detail)
}

func (e *RegionUnreachableError) Is(target error) bool { return target == ErrUnreachable }

// forwardFailures are what a Consul agent answers (HTTP 500) when it cannot
// get a request to a datacenter's servers, or those servers cannot serve it:
// the connection pool's dial errors, no server known, no leader elected.
var forwardFailures = []string{
	"rpc error getting client",
	"failed to get conn",
	"connection refused",
	"connection reset",
	"i/o timeout",
	"No known Consul servers",
	"No cluster leader",
	// Also what an agent says for a datacenter it knows but whose servers
	// have all failed; callers check a region's name against the known
	// datacenters first (regionctl does), so here it means unreachable.
	"No path to datacenter",
	// The datacenter is known but none of its servers answers (Consul's
	// ErrDCNotAvailable): its servers stopped while the WAN pool still
	// lists them.
	"Remote DC has no server currently reachable",
	"rpc error making call: EOF",
	"stream closed", // the connection dropped mid-call
}

// classifyIn is classify for a request to region's datacenter: an agent's
// 500 saying it could not reach the region's servers is ErrUnreachable for
// that region, not a generic error.
func classifyIn(region, doing string, err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusInternalServerError {
		for _, f := range forwardFailures {
			if strings.Contains(se.Body, f) {
				return &RegionUnreachableError{Region: region, Doing: doing, Detail: strings.TrimSpace(se.Body)}
			}
		}
	}
	return classify(doing, err)
}

// filtered turns Consul's silent ACL filtering of a read into an error: a
// token that may not read the documents must not look like "no documents".
func filtered(doing string, meta *api.QueryMeta) error {
	if meta != nil && meta.ResultsFilteredByACLs {
		return fmt.Errorf("%s: %w: results filtered by ACLs", doing, ErrPermissionDenied)
	}
	return nil
}

// Client talks to one Consul agent; requests for another region travel to
// that region's datacenter over Consul's WAN federation.
type Client struct {
	api    *api.Client
	layout Layout
	onPart func(region string, i, n int) error
	// beforeCollect (tests) runs between CollectParts' read and its
	// deletion: where a concurrent push commits in the race it guards.
	beforeCollect func()
	// now (tests) is the pusher's clock; nil is time.Now.
	now func() time.Time
}

// NewClient builds a client; it does not contact Consul.
func NewClient(cfg *api.Config, prefix string) (*Client, error) {
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("configuring consul client: %w", err)
	}
	return &Client{api: c, layout: NewLayout(prefix)}, nil
}

// Layout is the client's key layout.
func (c *Client) Layout() Layout { return c.layout }

// API is the underlying Consul client.
func (c *Client) API() *api.Client { return c.api }

// Regions lists the known regions (Consul datacenters).
func (c *Client) Regions() ([]string, error) {
	dcs, err := c.api.Catalog().Datacenters()
	return dcs, classify("listing regions", err)
}
