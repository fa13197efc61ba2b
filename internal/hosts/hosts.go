// Package hosts is the host table: which origin pool serves which
// hostname. A region's table is one YAML document (Consul key
// hosts/<region>, pushed with regionctl hosts push) naming pools of
// origins, each with its own URLs, timeouts, caps, health checks and TLS,
// and mapping exact hostnames and "*." wildcards to them. A host the table
// does not name goes to the pool named "default": the edge's --origin.
//
// Parse reads a document strictly and validates it, listing every problem
// with its line; Index turns a valid table into the lookup the request path
// runs, which allocates nothing and costs the same for ten hosts or a
// hundred thousand.
package hosts

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"time"

	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// DefaultPool is the edge's own pool, built from its --origin flags. A table
// may send hosts to it but not define it: its settings are the edge's.
const DefaultPool = "default"

// SchemaVersion is the only document version this package reads.
const SchemaVersion = 1

// Limits on one document. They bound what a malformed or hostile document
// can cost an edge to read and hold, at sizes that fit a large CDN's table:
// 8 MiB hold 100,000 entries of up to about 80 bytes (a typical entry is
// 35 to 50). A table over region.InlineMax is stored in Consul in parts,
// read back whole (package region); a wildcard stands for any number of
// hosts.
const (
	MaxDocumentSize = 8 << 20 // bytes of YAML
	MaxHosts        = 100000  // host entries
	MaxPools        = 256     // pools, each with its own connections and health checks
	MaxURLsPerPool  = 64      // origins in one pool
	MaxPoolNameLen  = 64
)

// Table is one region's host table.
type Table struct {
	// Schema is the document's version: 1.
	Schema int `yaml:"version" json:"version"`
	// Pools are the named origin pools, besides DefaultPool.
	Pools map[string]Pool `yaml:"pools" json:"pools,omitempty"`
	// Hosts maps a host pattern (an exact name or "*." and a suffix) to
	// its entry. Parse returns the patterns normalised.
	Hosts map[string]Host `yaml:"hosts" json:"hosts,omitempty"`
	// Defaults are the per-host settings of every host that does not set
	// its own, the hosts the table does not name included.
	Defaults *Defaults `yaml:"defaults" json:"defaults,omitempty"`
}

// Host is what the table says about one host pattern.
type Host struct {
	// Pool names the pool that serves the host: one of the table's pools
	// or DefaultPool.
	Pool string `yaml:"pool" json:"pool"`
	// Paths are how the edge reads the host's request paths; a field
	// left out takes the table's defaults, then the edge's flags.
	Paths `yaml:",inline"`
}

// Defaults are the table's defaults for per-host settings.
type Defaults struct {
	Paths `yaml:",inline"`
}

// Paths are how the edge reads a host's request paths: which origin's
// reading the rules match (docs/clients.md, "Path semantics"), and what
// it does with a path origins read differently.
type Paths struct {
	// PathSemantics is how the host's origin reads a path (package
	// pathsem): "rfc3986", or "servlet", "case-insensitive", "windows"
	// joined by '+'. The rules match the path so read.
	PathSemantics string `yaml:"path_semantics" json:"path_semantics,omitempty"`
	// RefuseAmbiguousPaths answers 400 to a path that origins of
	// different kinds read differently (pathsem.Normalize's ambiguous),
	// ';' parameters ("jsessionid") included.
	RefuseAmbiguousPaths *bool `yaml:"refuse_ambiguous_paths" json:"refuse_ambiguous_paths,omitempty"`
	// ForwardNormalizedPath sends the origin the path the rules matched,
	// re-encoded, instead of the path as the client sent it.
	ForwardNormalizedPath *bool `yaml:"forward_normalized_path" json:"forward_normalized_path,omitempty"`
}

// PathPolicy is a host's Paths resolved: what the request path runs on.
type PathPolicy struct {
	Semantics         pathsem.Semantics
	RefuseAmbiguous   bool
	ForwardNormalized bool
}

// over returns base with every field p sets replacing base's. p is valid
// (an unknown semantics leaves base's).
func (p Paths) over(base PathPolicy) PathPolicy {
	if p.PathSemantics != "" {
		if s, err := pathsem.Parse(p.PathSemantics); err == nil {
			base.Semantics = s
		}
	}
	if p.RefuseAmbiguousPaths != nil {
		base.RefuseAmbiguous = *p.RefuseAmbiguousPaths
	}
	if p.ForwardNormalizedPath != nil {
		base.ForwardNormalized = *p.ForwardNormalizedPath
	}
	return base
}

// DefaultPaths is base (the edge's flags) with the table's defaults over
// it: the policy of a host the table does not name.
func (t *Table) DefaultPaths(base PathPolicy) PathPolicy {
	if t == nil || t.Defaults == nil {
		return base
	}
	return t.Defaults.over(base)
}

// Pool is one origin pool. A field left out takes the edge's setting for
// its --origin pool (the base handed to Origin), so a pool only says how it
// differs; URLs and TLS are the pool's own and never inherited.
type Pool struct {
	// URLs are the pool's origins: http or https, host and port, no path.
	URLs []string `yaml:"urls" json:"urls"`
	// DialTimeout bounds connecting to one origin.
	DialTimeout *rules.Duration `yaml:"dial_timeout" json:"dial_timeout,omitempty"`
	// HeaderTimeout bounds the exchange up to the origin's response header.
	HeaderTimeout *rules.Duration `yaml:"header_timeout" json:"header_timeout,omitempty"`
	// ReadIdleTimeout bounds each wait for more of the response body.
	ReadIdleTimeout *rules.Duration `yaml:"read_idle_timeout" json:"read_idle_timeout,omitempty"`
	// Timeout bounds the whole exchange; "0s" sets no bound.
	Timeout *rules.Duration `yaml:"timeout" json:"timeout,omitempty"`
	// MaxConns caps connections to each origin of the pool (0: the origin
	// default, 512).
	MaxConns *int `yaml:"max_conns" json:"max_conns,omitempty"`
	// MaxRequestBodySize caps a streamed request body, in bytes (0: none).
	MaxRequestBodySize *int `yaml:"max_request_body_size" json:"max_request_body_size,omitempty"`
	// HealthCheckInterval is how often each origin is probed; "0s" turns
	// active checks off.
	HealthCheckInterval *rules.Duration `yaml:"health_check_interval" json:"health_check_interval,omitempty"`
	// HealthCheckPath is what the probe requests.
	HealthCheckPath *string `yaml:"health_check_path" json:"health_check_path,omitempty"`
	// UnhealthyAfter is how many failures in a row take an origin out.
	UnhealthyAfter *int `yaml:"unhealthy_after" json:"unhealthy_after,omitempty"`
	// EjectFor is how long real traffic keeps an origin it took out.
	EjectFor *rules.Duration `yaml:"eject_for" json:"eject_for,omitempty"`
	// RewriteHost sends the origin's host:port as Host instead of the
	// client's.
	RewriteHost *bool `yaml:"rewrite_host" json:"rewrite_host,omitempty"`
	// TLS is how the pool's https origins are reached; absent: the
	// system's roots, the URL's host name, verification on.
	TLS *TLS `yaml:"tls" json:"tls,omitempty"`
	// Concurrency bounds the pool's requests in flight; absent: the
	// --origin pool's (none unless its flags set one).
	Concurrency *Concurrency `yaml:"concurrency" json:"concurrency,omitempty"`
}

// Concurrency is a pool's concurrency limit (shedder.PoolLimitConfig):
// requests past it wait in the pool's queue or get 503 at once, before they
// take one of the edge's workers.
type Concurrency struct {
	// Limit is the most requests in flight to the pool (the most the
	// learned limit reaches when adaptive); 0: no limit.
	Limit int `yaml:"limit" json:"limit"`
	// Adaptive learns the limit from the pool's latency, between MinLimit
	// (default 4) and Limit, starting at InitialLimit (default 20).
	Adaptive     bool `yaml:"adaptive" json:"adaptive,omitempty"`
	MinLimit     int  `yaml:"min_limit" json:"min_limit,omitempty"`
	InitialLimit int  `yaml:"initial_limit" json:"initial_limit,omitempty"`
	// Queue is how many requests may wait past the limit (0: none), each
	// for at most QueueTimeout (default 100ms).
	Queue        int             `yaml:"queue" json:"queue,omitempty"`
	QueueTimeout *rules.Duration `yaml:"queue_timeout" json:"queue_timeout,omitempty"`
}

// TLS is the TLS to a pool's https origins.
type TLS struct {
	// ServerName is sent as SNI and verified; "" means each URL's host.
	ServerName string `yaml:"server_name" json:"server_name,omitempty"`
	// CAPEM is a PEM bundle of the CAs trusted; "" means the system's.
	CAPEM string `yaml:"ca_pem" json:"ca_pem,omitempty"`
	// InsecureSkipVerify accepts any certificate. Off unless set.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" json:"insecure_skip_verify,omitempty"`
}

// Origin is the pool's origin configuration: base (the edge's settings
// for its --origin pool) with every field the pool sets replacing base's.
// URLs and TLS are always the pool's: another pool's origins, server name
// and CAs say nothing about this one's, and verification stays on unless
// the pool itself turns it off.
func (p Pool) Origin(base origin.Config) origin.Config {
	c := base
	c.Pool = "" // the pool's name is its key in the table: the caller's to set
	c.URLs = slices.Clone(p.URLs)
	dur := func(dst *time.Duration, v *rules.Duration) {
		if v != nil {
			*dst = v.D()
		}
	}
	num := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	dur(&c.DialTimeout, p.DialTimeout)
	dur(&c.HeaderTimeout, p.HeaderTimeout)
	dur(&c.ReadIdleTimeout, p.ReadIdleTimeout)
	dur(&c.Timeout, p.Timeout)
	num(&c.MaxConnsPerHost, p.MaxConns)
	num(&c.MaxRequestBodySize, p.MaxRequestBodySize)
	dur(&c.HealthCheckInterval, p.HealthCheckInterval)
	if p.HealthCheckPath != nil {
		c.HealthCheckPath = *p.HealthCheckPath
	}
	num(&c.UnhealthyAfter, p.UnhealthyAfter)
	dur(&c.EjectFor, p.EjectFor)
	if p.RewriteHost != nil {
		c.RewriteHost = *p.RewriteHost
	}
	if p.Concurrency != nil {
		c.Concurrency = shedder.PoolLimitConfig{
			Limit: p.Concurrency.Limit, Adaptive: p.Concurrency.Adaptive,
			MinLimit: p.Concurrency.MinLimit, InitialLimit: p.Concurrency.InitialLimit,
			Queue: p.Concurrency.Queue,
		}
		if p.Concurrency.QueueTimeout != nil {
			c.Concurrency.QueueTimeout = p.Concurrency.QueueTimeout.D()
		}
	}
	c.TLS = origin.TLSConfig{}
	if p.TLS != nil {
		c.TLS.ServerName = p.TLS.ServerName
		if p.TLS.CAPEM != "" {
			c.TLS.CAPEM = []byte(p.TLS.CAPEM)
		}
		c.TLS.InsecureSkipVerify = p.TLS.InsecureSkipVerify
	}
	return c
}

// Version is a content hash of the table's meaning: 12 hex characters of
// SHA-256 over canonical JSON of the normalised table. Key order, YAML
// formatting, comments and host spellings that normalise alike do not
// change it. Meaningful for valid tables.
func (t *Table) Version() string {
	n := Table{Schema: t.Schema, Pools: t.Pools, Hosts: t.normalizedHosts(), Defaults: t.Defaults}
	data, _ := json.Marshal(n) // maps marshal in key order
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:12]
}

// PoolNames lists the table's pools, sorted.
func (t *Table) PoolNames() []string {
	names := make([]string, 0, len(t.Pools))
	for name := range t.Pools {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Unused lists the pools no host refers to, sorted. They are valid (a pool
// can be defined before hosts move to it) but cost an edge connections and
// health checks for nothing; regionctl warns about them.
func (t *Table) Unused() []string {
	used := map[string]bool{}
	for _, h := range t.Hosts {
		used[h.Pool] = true
	}
	var out []string
	for _, name := range t.PoolNames() {
		if !used[name] {
			out = append(out, name)
		}
	}
	return out
}

// normalizedHosts is Hosts with normalised patterns; a pattern that does
// not normalise is left out (Validate reports it), and of two that
// normalise alike the first in sorted order wins (Validate refuses both).
func (t *Table) normalizedHosts() map[string]Host {
	out := make(map[string]Host, len(t.Hosts))
	keys := make([]string, 0, len(t.Hosts))
	for k := range t.Hosts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, raw := range keys {
		p, err := normalizePattern(raw)
		if err != nil {
			continue
		}
		if _, dup := out[p]; !dup {
			out[p] = t.Hosts[raw]
		}
	}
	return out
}
