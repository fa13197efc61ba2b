package config

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// RLSConfig is the rate limit service listener: Envoy's global rate limit
// filter asks it over gRPC (envoy.service.ratelimit.v3), and it answers
// from this edge's limiter (same Redis, fallback, breakers and metrics)
// with envoyproxy/ratelimit's configuration files (docs/envoy.md).
type RLSConfig struct {
	// Listen is the gRPC address; empty: no rate limit service.
	Listen string
	// ConfigDir holds envoyproxy/ratelimit's YAML documents (every .yaml
	// and .yml under it), re-read on SIGHUP; an invalid set keeps the
	// previous one. Empty, with --consul: the documents are the region's
	// rls/<region>/ keys in Consul KV, watched.
	ConfigDir string
	// MergeDomains merges documents of one domain instead of refusing them.
	MergeDomains bool
	// StrictMatch matches a descriptor's entries by key and value apart
	// (rlsconfig.StrictMatch); by default by the joined key_value, as the
	// reference does.
	StrictMatch bool
	// OverrideFrom are the CIDRs of callers whose descriptor limit
	// overrides are applied; from anyone else they are ignored.
	OverrideFrom []netip.Prefix
	// Headers is off, draft or legacy: the header fields the answers ask
	// Envoy to add to the client's response.
	Headers string
	// HeaderNames is hashed or path: how the draft fields name a limit
	// without a rate_limit name.
	HeaderNames string
	// Shadow answers OK whatever the limits say, still counting.
	Shadow bool
	// MaxStreams is the calls one connection may have open at once (0:
	// rls.DefaultMaxStreams).
	MaxStreams int
	// MaxConnsPerIP caps the connections one client address (an IPv6
	// client's --ipv6-prefix network) may hold open; 0: no cap.
	MaxConnsPerIP int
	// Reflection serves gRPC server reflection.
	Reflection bool
	// TLSCert and TLSKey serve the listener over TLS; with ClientCA,
	// clients must present a certificate that CA signed (mTLS).
	TLSCert, TLSKey, ClientCA string
}

func (c *RLSConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "rls-listen", c.Listen, "gRPC address of Envoy's rate limit service (envoy.service.ratelimit.v3) over this edge's limiter; empty = off")
	fs.StringVar(&c.ConfigDir, "rls-config-dir", c.ConfigDir, "directory of envoyproxy/ratelimit YAML documents for --rls-listen (every .yaml/.yml under it); re-read on SIGHUP; empty with --consul: the region's rls/<region>/ documents in Consul KV, watched")
	fs.BoolVar(&c.MergeDomains, "rls-merge-domains", c.MergeDomains, "merge rate limit service documents of one domain instead of refusing them (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&c.StrictMatch, "rls-strict-match", c.StrictMatch, "match a rate limit service entry by its key and value apart; off = as envoyproxy/ratelimit, by the joined string key_value, so the entry destination=cluster_mock matches the descriptor destination_cluster: mock (docs/envoy.md)")
	fs.Var((*prefixesFlag)(&c.OverrideFrom), "rls-override-from", "CIDRs of rate limit service callers whose descriptor limit overrides apply; others' are ignored")
	fs.StringVar(&c.Headers, "rls-headers", c.Headers, "header fields the rate limit service asks Envoy to add to the client's response: off (none, as envoyproxy/ratelimit by default), draft (RateLimit-Policy and RateLimit) or legacy (RateLimit-Limit/-Remaining/-Reset)")
	fs.StringVar(&c.HeaderNames, "rls-header-names", c.HeaderNames, "how --rls-headers draft names a limit without a rate_limit name: hashed (a hash of its descriptor path salted with the key salt) or path (the descriptor path itself: shows clients internal domains, keys and descriptor values, other clients' included; docs/envoy.md)")
	fs.BoolVar(&c.Shadow, "rls-shadow", c.Shadow, "rate limit service answers OK whatever the limits say, still counting (envoyproxy/ratelimit's SHADOW_MODE)")
	fs.IntVar(&c.MaxStreams, "rls-max-concurrent-streams", c.MaxStreams, "calls one rate limit service connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; more are refused); also bounds the handlers a rapid-reset loop can start; 0 = 100")
	fs.IntVar(&c.MaxConnsPerIP, "rls-max-conns-per-ip", c.MaxConnsPerIP, "open rate limit service connections one client address (an IPv6 client's --ipv6-prefix network) may hold; more are closed at accept; 0 = no cap")
	fs.BoolVar(&c.Reflection, "rls-reflection", c.Reflection, "serve gRPC server reflection on --rls-listen (for grpcurl and the like; it lists the port's services to anyone who connects)")
	fs.StringVar(&c.TLSCert, "rls-tls-cert", c.TLSCert, "PEM certificate (chain) of the rate limit service's TLS; empty = plaintext gRPC")
	fs.StringVar(&c.TLSKey, "rls-tls-key", c.TLSKey, "PEM key of --rls-tls-cert")
	fs.StringVar(&c.ClientCA, "rls-client-ca", c.ClientCA, "PEM CA bundle: rate limit service clients must present a certificate it signed (mTLS)")
}

// Match is how the documents compile: rlsconfig's options for StrictMatch.
func (c RLSConfig) Match() []rlsconfig.Option {
	if c.StrictMatch {
		return []rlsconfig.Option{rlsconfig.StrictMatch()}
	}
	return nil
}

// problems lists the settings' problems; consul says whether --consul is
// set (then the documents may come from Consul instead of a directory).
func (c RLSConfig) problems(consul bool) []error {
	var errs []error
	if c.Listen == "" {
		return nil
	}
	if c.ConfigDir == "" && !consul {
		errs = append(errs, errors.New("rls-config-dir: required with --rls-listen (or --consul, to read the documents from Consul KV)"))
	}
	if _, err := rls.ParseHeaders(c.Headers); err != nil {
		errs = append(errs, fmt.Errorf("rls-headers: %w", err))
	}
	if _, err := rls.ParseNames(c.HeaderNames); err != nil {
		errs = append(errs, fmt.Errorf("rls-header-names: %w", err))
	}
	if c.MaxStreams < 0 || c.MaxStreams > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("rls-max-concurrent-streams: %d: want 1 to %d (0: %d)", c.MaxStreams, uint32(math.MaxUint32), rls.DefaultMaxStreams))
	}
	if c.MaxConnsPerIP < 0 {
		errs = append(errs, fmt.Errorf("rls-max-conns-per-ip: %d: want 0 (no cap) or more", c.MaxConnsPerIP))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("rls-tls-cert and rls-tls-key: both or neither"))
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New("rls-client-ca: needs --rls-tls-cert and --rls-tls-key"))
	}
	return errs
}
