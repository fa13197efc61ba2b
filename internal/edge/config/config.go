package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/accesslog"
	"github.com/edgeguard/edgeguard/internal/flaghelp"
	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
)

// Config is everything the edge is started with. Every field is a flag, and
// every flag can also be set as EDGEGUARD_<NAME> (dashes become underscores):
// --redis-mode is EDGEGUARD_REDIS_MODE. A flag on the command line wins.
type Config struct {
	// ConfigFile is the YAML file the other settings were read from, if any.
	ConfigFile string
	// Listen is the public address.
	Listen string
	// Admin is the admin address (metrics, health, readiness, rules, pprof).
	// Bind it to a private interface in a deployment.
	Admin string
	// Rules is the rules file (YAML, schema version 1).
	Rules string
	// Hosts is the host table file (YAML, schema version 1, docs/hosts.md):
	// the origin pool of each host; without it (and without Consul) every
	// host goes to the --origin pool.
	Hosts string
	// Region and PoP name where this node runs (Consul service meta, pop
	// scope).
	Region, PoP string
	// Workers caps the requests served at once; the queue in front of it
	// (queue_size, queue_timeout) comes from the shedder settings.
	Workers  int
	Shedder  string // shedder settings file (JSON); empty = defaults
	LogLevel string

	// The settings of each concern, their fields promoted.
	TLSSettings
	ClientSettings
	ServerSettings
	OriginSettings
	RedisSettings
	ConsulSettings
	ObservabilitySettings
	// RLS is Envoy's rate limit service (rls.go).
	RLS RLSConfig
}

// TLSSettings are the TLS listener's: certificates, session tickets, ACME, HTTP/2, and the
// PROXY protocol in front of the public listeners.
type TLSSettings struct {
	// ListenTLS is the public TLS address (empty: no TLS listener). It
	// serves the same handler as Listen, with certificates chosen by SNI
	// from TLSCertDir and TLSDefaultCert, reloaded when the files change.
	ListenTLS string
	// TLSCertDir holds the certificates (NAME.pem with chain and key, or
	// NAME.crt + NAME.key), named by their leaves' DNS SANs.
	TLSCertDir string
	// TLSDefaultCert is a PEM file (chain and key) for unknown names and
	// clients without SNI; without it such a handshake fails.
	TLSDefaultCert string
	// TLSCheckHost answers 421 Misdirected Request to a request over TLS
	// whose Host the certificate served on its connection does not cover.
	TLSCheckHost bool
	// TLSTicketKeys is a file of session-ticket keys (one per line, 64 hex
	// digits; the first encrypts, all decrypt), shared by a PoP's edges so
	// a client resumes on any of them; re-read when it changes. Empty:
	// each edge makes and rotates its own.
	TLSTicketKeys string
	// TLSTicketRotation is how often the region's session-ticket keys in
	// Consul are rotated (with --consul and --listen-tls, without
	// TLSTicketKeys): one edge of the region rotates them, every edge
	// follows. 0: the edges never rotate them (an operator does).
	TLSTicketRotation time.Duration
	// ACMEDomains are names whose certificates the edges of the region
	// obtain and renew from ACMECA (TLS-ALPN-01 on ListenTLS), with the
	// ACME state shared in Consul KV: needs --consul.
	ACMEDomains []string
	// ACMEEmail is the ACME account's contact address.
	ACMEEmail string
	// ACMECA is the ACME directory URL.
	ACMECA string
	// ACMECARoot is a PEM file of roots to trust for ACMECA's HTTPS (a
	// private or test CA); empty: the system's.
	ACMECARoot string
	// ACMERenewCheck (tests) is how often certmagic looks for
	// certificates to renew; 0: its default.
	ACMERenewCheck time.Duration
	// H2MaxStreams is HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS on
	// ListenTLS: the streams one connection may have open at once. 0
	// offers HTTP/1.1 only.
	H2MaxStreams int
	// H2MaxHeldBytes bounds the HTTP/2 response bytes the edge holds for
	// streams whose client has not taken them yet (flow control); one
	// client address holds at most an eighth of it (listen/h2_streams.go).
	H2MaxHeldBytes int64
	// ProxyProtocolFrom are the L4 balancers' CIDRs: a connection from one
	// must start with a PROXY protocol header (v1 or v2), which then names
	// the client; from anyone else a PROXY header is refused.
	ProxyProtocolFrom []netip.Prefix
}

// ClientSettings say who a client is and what it may send.
type ClientSettings struct {
	// TrustedProxies are CIDRs whose X-Forwarded-For (and priority headers)
	// are believed. IPv4-mapped IPv6 forms are read as IPv4.
	TrustedProxies []netip.Prefix
	// TrustAllProxies allows a catch-all range (0.0.0.0/0, ::/0) in
	// TrustedProxies: every client could then choose its own identity.
	TrustAllProxies bool
	// IPv6Prefix is the prefix length IPv6 clients are keyed by.
	IPv6Prefix int
	// LegacyHeaders adds X-RateLimit-Limit/-Remaining/-Reset for old clients.
	LegacyHeaders bool
	// AllowMethods passes methods the edge refuses by default (CONNECT,
	// TRACE) on to the origin.
	AllowMethods []string
	// DefaultHost is the Host given to a request that has none (HTTP/1.0
	// allows that); empty answers such a request 400.
	DefaultHost string
	// PathSemantics is how the origins read request paths (package
	// pathsem), for every host the host table does not say otherwise of:
	// the rules match the path so read.
	PathSemantics string
	// RefuseAmbiguousPaths answers 400 to a path origins of different
	// kinds read differently, for every host the host table does not say
	// otherwise of.
	RefuseAmbiguousPaths bool
	// AllowUnderscoresInHeaders passes header names with an underscore on
	// (nginx's underscores_in_headers); by default they are dropped, since
	// CGI-style origins read X_Api_Key as X-Api-Key.
	AllowUnderscoresInHeaders bool
	// MaxConnsPerIP caps the connections one socket peer may hold open:
	// an IPv4 address, or an IPv6 client's IPv6Prefix network. Trusted
	// proxies are exempt (they carry many clients); 0 turns the cap off.
	MaxConnsPerIP int
}

// ServerSettings are the public server's limits and timeouts.
type ServerSettings struct {
	// Server limits and timeouts.
	MaxHeaderBytes, MaxBodyBytes           int
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	DrainDelay, ShutdownTimeout            time.Duration
}

// OriginSettings are the origins' and the proxy's.
type OriginSettings struct {
	// Origins are the origin URLs. One is required unless DemoOrigin.
	Origins []string
	// DemoOrigin serves a built-in demo origin (make run); never in production.
	DemoOrigin bool
	// OriginMaxConns caps connections to each origin; 0 sizes the pool to
	// Workers (+1 for the health check), so every worker can hold one
	// origin connection.
	OriginMaxConns int
	// OriginConcurrencyLimit bounds the --origin pool's requests in flight
	// (0: none; the host table sets other pools'): past it a request waits
	// in the pool's queue (OriginConcurrencyQueue places, each for at most
	// OriginConcurrencyQueueTimeout) or gets 503 at once, before it takes
	// a worker.
	OriginConcurrencyLimit        int
	OriginConcurrencyQueue        int
	OriginConcurrencyQueueTimeout time.Duration
	// MaxTunnels caps the upgraded connections (WebSocket and the like)
	// open at once; past it an upgrade is answered 503. 0 turns
	// tunnelling off (Upgrade is stripped, as any hop-by-hop field).
	MaxTunnels int
	// TunnelIdleTimeout closes a tunnel in which neither side sent a byte
	// for that long.
	TunnelIdleTimeout time.Duration
	// Origin timeouts, one per phase of the exchange: connecting, up to the
	// response header, between reads of the body, and (when set) overall.
	OriginDialTimeout, OriginHeaderTimeout, OriginReadIdleTimeout, OriginTimeout time.Duration
	// OriginTLSServerName is sent as SNI to https origins and verified
	// against their certificates; empty = each origin URL's host name.
	OriginTLSServerName string
	// OriginCAFile is a PEM file of the CAs trusted for https origins'
	// certificates, read at start; empty = the system's roots.
	OriginCAFile string
	// OriginTLSInsecureSkipVerify accepts any certificate an https origin
	// shows (logged as a warning at start).
	OriginTLSInsecureSkipVerify bool
}

// RedisSettings are the rate limit store's: Redis, its deadline and fail mode, the
// key salt, and the fallback's divisors.
type RedisSettings struct {
	// Redis is a go-redis URL; empty uses the embedded memory store. A
	// password goes in EDGEGUARD_REDIS_PASSWORD or --redis-password-file
	// (or in the URL given through EDGEGUARD_REDIS), never on the command
	// line.
	Redis string
	// RedisPassword is the Redis password (environment only), merged into
	// Redis when read.
	RedisPassword string
	// RedisPasswordFile holds the Redis password (one line).
	RedisPasswordFile string
	// RedisMode is standalone, cluster or sentinel.
	RedisMode limiter.Mode
	// RedisTimeout bounds one Redis round trip; past it the fail mode decides.
	// A slow Redis is waited for (limits stay exact); a frozen one costs the
	// requests of one deadline before the breaker opens.
	RedisTimeout time.Duration
	// RedisAutopipeline (on by default) batches concurrent requests'
	// single-limit calls: a call that finds its Redis master busy waits and
	// leaves with the others as one call of the batch script, a lone call
	// goes at once (pkg/limiter lanes, BENCHMARKS.md). It has no effect
	// without Redis.
	RedisAutopipeline bool
	// FailMode is what happens when Redis cannot decide: fallback (local
	// memory store with limit / nodes), open (admit) or closed (503).
	FailMode      limiter.FailMode
	PrefilterSize int
	// KeySalt is mixed into the hash of descriptor values in Redis keys:
	// without it, a hashed IPv4 address can be enumerated back. Required
	// with Redis, and every edge sharing a Redis must use the same salt.
	KeySalt string
	// KeySaltFile holds the salt (one line); read at start, exclusive with
	// KeySalt. It keeps the secret out of the process list.
	KeySaltFile string
	// NodesInRegion and NodesInPoP divide limits in the local fallback.
	NodesInRegion, NodesInPoP int
}

// ConsulSettings are the Consul link's.
type ConsulSettings struct {
	// Consul is the local Consul agent's address ("" = no Consul). With it,
	// rules and shedder settings come from Consul KV and change live, and the
	// edge registers itself in the catalog. The ACL token comes from
	// EDGEGUARD_CONSUL_TOKEN, --consul-token-file, or Consul's own
	// CONSUL_HTTP_TOKEN / CONSUL_HTTP_TOKEN_FILE; never the command line.
	Consul, ConsulToken, ConsulPrefix   string
	ConsulTokenFile                     string
	ConsulCAFile, ConsulCert, ConsulKey string
	// RulesCache keeps the last good rules from Consul, so a restart while
	// Consul is unreachable still enforces them.
	RulesCache string
	// Advertise is the public address registered in the catalog ("" = the
	// agent's node address and the --listen port).
	Advertise string
}

// ObservabilitySettings are the admin port's, the access log's, tracing's and the metrics'
// labels.
type ObservabilitySettings struct {
	// AdminToken guards the admin port's /debug endpoints (Authorization:
	// Bearer TOKEN); without one they answer 403. From EDGEGUARD_ADMIN_TOKEN
	// or AdminTokenFile.
	AdminToken, AdminTokenFile string
	// Pprof serves /debug/pprof on the admin port (behind the token).
	Pprof bool
	// AccessLog is the access log's file ("-" = standard output, "" = off):
	// one line per request, written off the request path, reopened on
	// SIGHUP and SIGUSR1 (log rotation).
	AccessLog string
	// AccessLogFormat is json or logfmt.
	AccessLogFormat string
	// AccessLogSample is the share of proxied requests logged (0..1);
	// every request the edge answered itself (denied, shed, refused) is.
	AccessLogSample float64
	// OTLPEndpoint is the OTLP/HTTP traces URL (http://collector:4318/v1/traces);
	// empty = no tracing.
	OTLPEndpoint string
	// TraceSampleRatio is the share of requests traced that arrive without
	// a sampled trace context from a trusted peer (0..1).
	TraceSampleRatio float64
	// MetricsRegionLabels adds region and pop to every series this edge
	// exports. Off by default: Prometheus attaches them as target labels
	// from the Consul service meta (docs/deployment.md), and a series that
	// carries them too would see them renamed exported_region/exported_pop.
	MetricsRegionLabels bool
}

// DefaultConfig is a single node on the memory store; it still needs an
// origin (or DemoOrigin).
func DefaultConfig() Config {
	return Config{
		Listen:   ":8080",
		Admin:    "127.0.0.1:18391",
		Region:   "local",
		PoP:      "local",
		Workers:  512 * runtime.GOMAXPROCS(0),
		LogLevel: "info",
		TLSSettings: TLSSettings{
			H2MaxStreams:      100,
			H2MaxHeldBytes:    256 << 20,
			TLSTicketRotation: 24 * time.Hour,
			ACMECA:            "https://acme-v02.api.letsencrypt.org/directory",
		},
		ClientSettings: ClientSettings{
			IPv6Prefix:    64,
			MaxConnsPerIP: 256,
			PathSemantics: "rfc3986",
		},
		ServerSettings: ServerSettings{
			MaxHeaderBytes:  8 << 10,
			MaxBodyBytes:    10 << 20,
			ReadTimeout:     10 * time.Second,
			WriteTimeout:    10 * time.Second,
			IdleTimeout:     60 * time.Second,
			DrainDelay:      5 * time.Second,
			ShutdownTimeout: 30 * time.Second,
		},
		OriginSettings: OriginSettings{
			OriginDialTimeout:             time.Second,
			OriginHeaderTimeout:           10 * time.Second,
			OriginConcurrencyQueueTimeout: 100 * time.Millisecond,
			OriginReadIdleTimeout:         60 * time.Second,
			// A CDN edge holds many long-lived sockets; 10,000 tunnels
			// cost two goroutines and two 32 KiB buffers while copying,
			// well under a gigabyte, and each holds no worker.
			MaxTunnels: 10000,
			// Longer than the keep-alive pings WebSocket libraries and
			// browsers send (tens of seconds), short enough that a dead
			// peer behind a silent NAT does not hold a socket for hours.
			TunnelIdleTimeout: 5 * time.Minute,
		},
		RedisSettings: RedisSettings{
			RedisMode:         limiter.ModeStandalone,
			RedisTimeout:      limiter.DefaultTimeout,
			RedisAutopipeline: true,
			FailMode:          limiter.FailFallback,
			PrefilterSize:     100_000,
			NodesInRegion:     1,
			NodesInPoP:        1,
		},
		ConsulSettings: ConsulSettings{ConsulPrefix: "edgeguard/"},
		ObservabilitySettings: ObservabilitySettings{
			AccessLogFormat:  "json",
			AccessLogSample:  1,
			TraceSampleRatio: 0.01,
		},
		RLS: RLSConfig{Headers: "off", HeaderNames: "hashed", MaxStreams: rls.DefaultMaxStreams, MaxConnsPerIP: 64},
	}
}

// ParseArgs reads the command line, the environment (every EDGEGUARD_
// variable must name a setting) and the --config file over the defaults.
func ParseArgs(args, environ []string, usage io.Writer) (Config, error) {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return parse(args, func(k string) string { return env[k] }, environ, usage)
}

// ParseFlags reads args, the environment (getenv) and the --config file
// over the defaults; variables that name no setting are not looked for.
func ParseFlags(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	return parse(args, getenv, nil, usage)
}

// newFlagSet declares every setting of c as a flag: the one list of the
// edge's settings (flags, EDGEGUARD_ variables, config keys, the reference
// table).
// displayDefaults are the defaults computed on the machine, as help and
// the reference say them.
var displayDefaults = map[string]string{"workers": "512 × cores"}

func newFlagSet(c *Config, usage io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() {
		fmt.Fprintf(usage, "Usage: edge [flags]\n       edge check [flags]   validate the config, --rules and --shedder files offline\n       edge rls             Envoy's rate limit service alone, under envoyproxy/ratelimit's\n                            environment variables (docs/envoy.md)\n       edge --version\n\nEvery flag can also be set in the environment as EDGEGUARD_<NAME>\n(--redis-mode is EDGEGUARD_REDIS_MODE) and in the --config file by its name\n(redis-mode: cluster); the command line wins over the environment, which wins\nover the file.\n\n")
		flaghelp.Print(usage, fs, displayDefaults)
	}
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "config file (YAML): any flag by its name, e.g. redis-timeout: 50ms; the command line and EDGEGUARD_ variables win over it")
	fs.StringVar(&c.Listen, "listen", c.Listen, "public listen address")
	fs.StringVar(&c.ListenTLS, "listen-tls", c.ListenTLS, "public TLS listen address (TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1); empty = no TLS listener")
	fs.StringVar(&c.TLSCertDir, "tls-cert-dir", c.TLSCertDir, "directory of certificates for --listen-tls (NAME.pem with chain and key, or NAME.crt + NAME.key), chosen by SNI, re-read within 2 s of a change")
	fs.BoolVar(&c.TLSCheckHost, "tls-check-host", c.TLSCheckHost, "answer 421 Misdirected Request to a TLS request whose Host the connection's certificate does not cover (HTTP/2 connection reuse for another name the certificate covers keeps working); off = any Host on any TLS connection")
	fs.StringVar(&c.TLSDefaultCert, "tls-default-cert", c.TLSDefaultCert, "PEM file (chain and key) served to unknown names and clients without SNI; none = such handshakes fail")
	fs.IntVar(&c.H2MaxStreams, "h2-max-concurrent-streams", c.H2MaxStreams, "HTTP/2 on --listen-tls (ALPN h2): streams one connection may have open at once; 0 = HTTP/1.1 only")
	fs.Int64Var(&c.H2MaxHeldBytes, "h2-max-held-bytes", c.H2MaxHeldBytes, "HTTP/2: response bytes the edge holds at once for streams whose client has not taken them yet (flow control); one client address holds at most an eighth (or one response); a stream over it is answered 503")
	fs.DurationVar(&c.TLSTicketRotation, "tls-ticket-rotation", c.TLSTicketRotation, "with --consul and --listen-tls (and no --tls-ticket-keys): how often one edge of the region rotates the region's session-ticket keys in Consul (the previous two still decrypt); 0 = the edges never rotate them")
	fs.Var((*listFlag)(&c.ACMEDomains), "acme-domains", "names whose certificates the region's edges obtain and renew by ACME (TLS-ALPN-01 on --listen-tls; state shared in Consul, needs --consul); comma-separate or repeat")
	fs.StringVar(&c.ACMEEmail, "acme-email", c.ACMEEmail, "ACME account contact address")
	fs.StringVar(&c.ACMECA, "acme-ca", c.ACMECA, "ACME directory URL")
	fs.StringVar(&c.ACMECARoot, "acme-ca-root", c.ACMECARoot, "PEM file of roots to trust for the ACME server's HTTPS (a private or test CA); empty = the system's")
	fs.StringVar(&c.TLSTicketKeys, "tls-ticket-keys", c.TLSTicketKeys, "file of TLS session-ticket keys, one per line (64 hex digits: openssl rand -hex 32); the first encrypts, all decrypt; the same file on every edge of a PoP lets clients resume on any; re-read on change")
	fs.Var((*prefixesFlag)(&c.ProxyProtocolFrom), "proxy-protocol-from", "CIDRs of L4 balancers that send a PROXY protocol header (v1/v2) on every connection; from anyone else a PROXY header is refused")
	fs.StringVar(&c.Admin, "admin", c.Admin, "admin listen address (/metrics, /healthz, /readyz, /debug/rules, /debug/pprof); keep it private")
	fs.StringVar(&c.Hosts, "hosts", c.Hosts, "host table file (YAML, docs/hosts.md): an origin pool per host name, the --origin pool for the rest; re-read on SIGHUP; with --consul the table comes from Consul instead")
	fs.Var((*listFlag)(&c.Origins), "origin", "origin URL; repeat or comma-separate for several; required unless --demo-origin")
	fs.BoolVar(&c.DemoOrigin, "demo-origin", c.DemoOrigin, "proxy to a built-in demo origin on loopback (make run); never in production")
	fs.StringVar(&c.Redis, "redis", c.Redis, "go-redis URL (redis://user:pass@h1:6379?addr=h2:6379, rediss:// for TLS, ?master_name= for Sentinel); empty = embedded memory store")
	fs.StringVar(&c.RedisPassword, "redis-password", c.RedisPassword, "Redis password: environment only (EDGEGUARD_REDIS_PASSWORD) or --redis-password-file; merged into --redis")
	fs.StringVar(&c.RedisPasswordFile, "redis-password-file", c.RedisPasswordFile, "file holding the Redis password (or EDGEGUARD_REDIS_PASSWORD); a password on the command line is refused")
	fs.Var((*modeFlag)(&c.RedisMode), "redis-mode", "standalone, cluster or sentinel")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", c.RedisTimeout, "deadline of one Redis round trip: a slower call is decided by --fail-mode and counts towards opening the breaker, unless the Redis nodes it went to keep answering this edge's other calls (then it is waited for, up to 4 times this)")
	fs.BoolVar(&c.RedisAutopipeline, "redis-autopipeline", c.RedisAutopipeline, "batch concurrent requests' single-limit Redis calls (one script call per batch and Redis master; a call that finds its master idle goes at once); =false sends each request's calls on their own")
	fs.Var((*failFlag)(&c.FailMode), "fail-mode", "when Redis cannot decide: fallback (local limit / nodes), open (admit) or closed (503; /readyz then answers 503 too)")
	fs.StringVar(&c.Rules, "rules", c.Rules, "rules file (YAML, version 1); re-read on SIGHUP")
	fs.StringVar(&c.Consul, "consul", c.Consul, "local Consul agent (host:port, or https://host:port); rules, shedder settings and registration come from it; empty = no Consul")
	fs.StringVar(&c.ConsulToken, "consul-token", c.ConsulToken, "Consul ACL token: environment only (EDGEGUARD_CONSUL_TOKEN, or Consul's CONSUL_HTTP_TOKEN)")
	fs.StringVar(&c.ConsulTokenFile, "consul-token-file", c.ConsulTokenFile, "file holding the Consul ACL token (or CONSUL_HTTP_TOKEN_FILE)")
	fs.StringVar(&c.ConsulPrefix, "consul-prefix", c.ConsulPrefix, "Consul KV prefix of edgeguard's documents")
	fs.StringVar(&c.ConsulCAFile, "consul-ca-file", c.ConsulCAFile, "CA bundle to verify Consul's TLS certificate")
	fs.StringVar(&c.ConsulCert, "consul-cert-file", c.ConsulCert, "client certificate for Consul TLS")
	fs.StringVar(&c.ConsulKey, "consul-key-file", c.ConsulKey, "client key for Consul TLS")
	fs.StringVar(&c.RulesCache, "rules-cache", c.RulesCache, "file keeping the last good rules from Consul (default: rules-<region>.yaml in $STATE_DIRECTORY, else /var/lib/edgeguard when writable, else the user cache dir under edgeguard/; never the temporary directory)")
	fs.StringVar(&c.Advertise, "advertise", c.Advertise, "public address registered in Consul (default: the agent's node address, --listen port)")
	fs.StringVar(&c.Region, "region", c.Region, "region this node runs in (its Consul datacenter)")
	fs.StringVar(&c.PoP, "pop", c.PoP, "PoP this node runs in")
	fs.BoolVar(&c.MetricsRegionLabels, "metrics-region-labels", c.MetricsRegionLabels, "add region and pop labels to every exported series (for a Prometheus that cannot attach them as target labels from the Consul service meta)")
	fs.IntVar(&c.NodesInRegion, "nodes-in-region", c.NodesInRegion, "edge nodes in the region (the fallback enforces limit / this)")
	fs.IntVar(&c.NodesInPoP, "nodes-in-pop", c.NodesInPoP, "edge nodes in the PoP (fallback divisor for scope: pop rules)")
	fs.Var((*prefixesFlag)(&c.TrustedProxies), "trusted-proxies", "CIDRs of proxies whose X-Forwarded-For and priority headers are trusted (comma-separated; a catch-all range needs --trust-all-proxies)")
	fs.BoolVar(&c.TrustAllProxies, "trust-all-proxies", c.TrustAllProxies, "allow 0.0.0.0/0 or ::/0 in --trusted-proxies (every client could then pick its identity)")
	fs.StringVar(&c.KeySalt, "key-salt", c.KeySalt, "salt of the descriptor hash in Redis keys, at least 16 characters; required with --redis, the same on every edge of a region: environment only (EDGEGUARD_KEY_SALT) or --key-salt-file")
	fs.StringVar(&c.KeySaltFile, "key-salt-file", c.KeySaltFile, "file holding the key salt (instead of --key-salt)")
	fs.IntVar(&c.IPv6Prefix, "ipv6-prefix", c.IPv6Prefix, "prefix length IPv6 clients are keyed by")
	fs.BoolVar(&c.LegacyHeaders, "legacy-headers", c.LegacyHeaders, "also send X-RateLimit-Limit/-Remaining/-Reset")
	fs.DurationVar(&c.OriginDialTimeout, "origin-dial-timeout", c.OriginDialTimeout, "origin connect timeout; past it the next origin is tried, else 502")
	fs.DurationVar(&c.OriginHeaderTimeout, "origin-header-timeout", c.OriginHeaderTimeout, "from sending the request to the origin's response header (connect and request body included); past it 504")
	fs.DurationVar(&c.OriginReadIdleTimeout, "origin-read-idle-timeout", c.OriginReadIdleTimeout, "longest wait for more of the origin's response body once its header is in; past it the response is cut short (a stream lives as long as it moves)")
	fs.StringVar(&c.OriginTLSServerName, "origin-tls-server-name", c.OriginTLSServerName, "name sent as SNI to https origins and verified against their certificates; empty = each --origin URL's host name")
	fs.StringVar(&c.OriginCAFile, "origin-ca-file", c.OriginCAFile, "PEM file of the CAs trusted for https origins' certificates, read at start; empty = the system's roots")
	fs.BoolVar(&c.OriginTLSInsecureSkipVerify, "origin-tls-insecure-skip-verify", c.OriginTLSInsecureSkipVerify, "accept any certificate an https origin shows (no verification; logged as a warning at start)")
	fs.DurationVar(&c.OriginTimeout, "origin-timeout", c.OriginTimeout, "whole origin exchange, response body included: past it 504, or the body is cut short; 0 = no bound (long downloads, server-sent events, long polls)")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", c.MaxHeaderBytes, "largest request header block; larger gets 431")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest request body (streamed to the origin, never held whole); larger gets 413")
	fs.IntVar(&c.MaxConnsPerIP, "max-conns-per-ip", c.MaxConnsPerIP, "open connections one client socket address (an IPv6 client's --ipv6-prefix network) may hold; more are answered 429 at accept; trusted proxies are exempt; 0 = no cap")
	fs.IntVar(&c.OriginConcurrencyLimit, "origin-concurrency-limit", c.OriginConcurrencyLimit, "requests in flight to the --origin pool; past it a request waits in the pool's queue (--origin-concurrency-queue) or gets 503 before it takes a worker; 0 = no limit (the host table sets its pools' own)")
	fs.IntVar(&c.OriginConcurrencyQueue, "origin-concurrency-queue", c.OriginConcurrencyQueue, "requests that may wait past --origin-concurrency-limit; 0 = refused at once")
	fs.DurationVar(&c.OriginConcurrencyQueueTimeout, "origin-concurrency-queue-timeout", c.OriginConcurrencyQueueTimeout, "the longest a request waits in the --origin pool's queue before its 503")
	fs.IntVar(&c.OriginMaxConns, "origin-max-conns", c.OriginMaxConns, "connections to each origin; 0 = --workers + 1 (every worker can hold one); when they are all busy the edge answers 503")
	fs.StringVar(&c.DefaultHost, "default-host", c.DefaultHost, "Host given to a request that has none (HTTP/1.0); empty = such a request is answered 400")
	fs.StringVar(&c.PathSemantics, "path-semantics", c.PathSemantics, "how the origins read request paths, which the rules match: rfc3986, or servlet, case-insensitive, windows joined by '+' (docs/clients.md, \"Path semantics\"); the host table's path_semantics overrides it per host")
	fs.BoolVar(&c.RefuseAmbiguousPaths, "refuse-ambiguous-paths", c.RefuseAmbiguousPaths, "answer 400 to a request path origins of different kinds read differently (';' parameters such as jsessionid included); the host table's refuse_ambiguous_paths overrides it per host")
	fs.BoolVar(&c.AllowUnderscoresInHeaders, "allow-underscores-in-headers", c.AllowUnderscoresInHeaders, "pass header names with an underscore to the origin (dropped by default: CGI-style origins read X_Api_Key as X-Api-Key)")
	fs.Var((*methodsFlag)(&c.AllowMethods), "allow-methods", "methods refused by default (CONNECT, TRACE) to pass to the origin (comma-separated)")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "client request read timeout")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", c.WriteTimeout, "client response write timeout, per write: each socket write must be taken by the client within it, else the connection is closed; HTTP/2 also each 16 KiB piece of a response for a stream (else RST_STREAM)")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "keep-alive idle timeout")
	fs.DurationVar(&c.DrainDelay, "drain-delay", c.DrainDelay, "on SIGTERM, how long /readyz reports 503 before the listener closes")
	fs.IntVar(&c.MaxTunnels, "max-tunnels", c.MaxTunnels, "upgraded connections (WebSocket) open at once; past it an upgrade is answered 503 with Retry-After; 0 = upgrades are not tunnelled (Upgrade is stripped)")
	fs.DurationVar(&c.TunnelIdleTimeout, "tunnel-idle-timeout", c.TunnelIdleTimeout, "an upgraded connection in which neither side sent a byte for this long is closed")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long in-flight requests may take to finish on shutdown")
	fs.IntVar(&c.Workers, "workers", c.Workers, "requests run at once (worker cap); more wait in a short queue, then 503")
	fs.StringVar(&c.Shedder, "shedder", c.Shedder, "load shedder settings file (JSON: good, bad, start_after, full_after, tiers, queue_size, queue_timeout, …); re-read on SIGHUP; empty = defaults")
	fs.IntVar(&c.PrefilterSize, "prefilter-size", c.PrefilterSize, "keys held by the local over-limit cache")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.AdminToken, "admin-token", c.AdminToken, "bearer token of the admin port's /debug endpoints: environment only (EDGEGUARD_ADMIN_TOKEN) or --admin-token-file; none = /debug answers 403")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", c.AdminTokenFile, "file holding the admin token")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve /debug/pprof on the admin port (needs the admin token)")
	fs.StringVar(&c.AccessLog, "access-log", c.AccessLog, "access log file, one line per request (- = standard output; empty = off); reopened on SIGHUP and SIGUSR1")
	fs.StringVar(&c.AccessLogFormat, "access-log-format", c.AccessLogFormat, "access log format: json or logfmt")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", c.OTLPEndpoint, "OpenTelemetry traces over OTLP/HTTP to this URL (http://collector:4318/v1/traces); empty = no tracing")
	fs.Float64Var(&c.TraceSampleRatio, "trace-sample-ratio", c.TraceSampleRatio, "share of requests traced, 0..1 (a trusted peer's sampled trace context is always followed)")
	fs.Float64Var(&c.AccessLogSample, "access-log-sample", c.AccessLogSample, "share of proxied requests logged, 0..1 (denied, shed and refused requests always are)")
	c.RLS.flags(fs)

	return fs
}

func parse(args []string, getenv func(string) string, environ []string, usage io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := newFlagSet(&c, usage)
	// The command line first; the environment fills only the flags it did
	// not set. So a flag wins over its variable, list flags included (their
	// values add up within the command line, never across the two).
	if err := fs.Parse(args); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			err = usageError{err}
		}
		return c, err
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	if environ != nil {
		if err := checkEnviron(fs, environ); err != nil {
			return c, err
		}
	}
	var errs []error
	setElsewhere := maps.Clone(onCommandLine)
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		if v := getenv(env); v != "" && !onCommandLine[f.Name] {
			setElsewhere[f.Name] = true
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, setError(f, v, err)))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	// Every problem at once: the file's, the secrets', then the values'.
	if c.ConfigFile != "" {
		errs = append(errs, applyConfigFile(fs, c.ConfigFile, setElsewhere))
	}
	errs = append(errs, c.readSecrets(onCommandLine, getenv))
	if err := errors.Join(errs...); err != nil {
		return c, errors.Join(err, c.Validate())
	}
	return c, c.Validate()
}

// setError says what a flag wanted instead of the flag package's bare
// "parse error".
func setError(f *flag.Flag, v string, err error) error {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return fmt.Errorf("want true or false, got %q", v)
	}
	if errors.Is(err, strconv.ErrSyntax) || errors.Is(err, strconv.ErrRange) || strings.Contains(err.Error(), "parse error") {
		return fmt.Errorf("invalid value %q for %s (default %s)", v, f.Name, f.DefValue)
	}
	return err
}

// secretFlags may not be given on the command line: every local user can
// read a process's arguments (ps, /proc/PID/cmdline).
var secretFlags = []string{"key-salt", "consul-token", "admin-token", "redis-password"}

// readSecrets reads the secrets from their files and the variables their
// ecosystems use, and refuses any on the command line.
func (c *Config) readSecrets(onCommandLine map[string]bool, getenv func(string) string) error {
	var errs []error
	given := map[string]string{"key-salt": c.KeySalt, "consul-token": c.ConsulToken, "admin-token": c.AdminToken, "redis-password": c.RedisPassword}
	for _, name := range secretFlags {
		// An empty value reveals nothing: it is the default, and accepted.
		if onCommandLine[name] && given[name] != "" {
			errs = append(errs, fmt.Errorf("%s: a secret on the command line is visible to every local user (ps); use %s or --%s-file", name, EnvName(name), name))
		}
	}
	if onCommandLine["redis"] && redisURLHasPassword(c.Redis) {
		errs = append(errs, errors.New("redis: a password in --redis is visible to every local user (ps); use EDGEGUARD_REDIS_PASSWORD, --redis-password-file, or the URL in EDGEGUARD_REDIS"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	read := func(dst *string, file *string, name string) {
		if *file == "" {
			return
		}
		if *dst != "" {
			errs = append(errs, fmt.Errorf("%s: %s and --%s-file are exclusive", name, EnvName(name), name))
			return
		}
		v, err := readSecretFile(*file)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s-file: %w", name, err))
			return
		}
		*dst, *file = v, "" // read: Validate sees the value
	}
	read(&c.KeySalt, &c.KeySaltFile, "key-salt")
	read(&c.ConsulToken, &c.ConsulTokenFile, "consul-token")
	read(&c.AdminToken, &c.AdminTokenFile, "admin-token")
	read(&c.RedisPassword, &c.RedisPasswordFile, "redis-password")
	password := c.RedisPassword
	c.RedisPassword = "" // in the URL from here on
	if password == "" && c.Redis != "" && !redisURLHasPassword(c.Redis) && getenv("REDIS_PASSWORD") != "" {
		// Read until this release; an edge that relied on it would now
		// reach Redis without a password. Its value is never read.
		errs = append(errs, errors.New("redis-password: REDIS_PASSWORD is no longer read (the edge reads only EDGEGUARD_ variables); set EDGEGUARD_REDIS_PASSWORD or --redis-password-file, or unset REDIS_PASSWORD"))
	}
	if password != "" {
		if c.Redis == "" {
			errs = append(errs, errors.New("redis-password: given without --redis"))
		} else if u, err := redisURLWithPassword(c.Redis, password); err != nil {
			errs = append(errs, err)
		} else {
			c.Redis = u
		}
	}
	return errors.Join(errs...)
}

// readSecretFile reads a one-line secret; the trailing newline is dropped.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

// redisURLHasPassword reports whether a go-redis URL carries a password
// (user info, or Sentinel's password / sentinel_password parameters).
func redisURLHasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false // Validate reports it
	}
	if _, ok := u.User.Password(); ok {
		return true
	}
	q := u.Query()
	return q.Get("password") != "" || q.Get("sentinel_password") != ""
}

// redisURLWithPassword puts password in the URL's user info (the data
// nodes' password; go-redis reads it there in every mode).
func redisURLWithPassword(raw, password string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("redis: %w", err)
	}
	if _, ok := u.User.Password(); ok {
		return "", errors.New("redis-password: the URL already has a password")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), nil
}

// EnvName is the environment variable of a flag: EDGEGUARD_REDIS_MODE.
func EnvName(flagName string) string {
	return "EDGEGUARD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Listen == "" {
		bad("listen: required")
	}
	if c.Admin == "" {
		bad("admin: required")
	}
	if c.Admin == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		bad("admin: must differ from listen (nothing admin on the public port)")
	}
	switch {
	case c.ListenTLS != "" && c.TLSCertDir == "" && c.TLSDefaultCert == "" && c.Consul == "":
		bad("listen-tls: needs --tls-cert-dir, --tls-default-cert or --consul (certificates in Consul KV)")
	case c.ListenTLS == "" && (c.TLSCertDir != "" || c.TLSDefaultCert != "" || c.TLSTicketKeys != ""):
		bad("tls-cert-dir, tls-default-cert, tls-ticket-keys: given without --listen-tls")
	}
	if len(c.ACMEDomains) > 0 && (c.ListenTLS == "" || c.Consul == "") {
		bad("acme-domains: needs --listen-tls (challenges are answered there) and --consul (the region's edges share the ACME state)")
	}
	for _, d := range c.ACMEDomains {
		if !UsableHost([]byte(d)) || strings.Contains(d, ":") || strings.HasPrefix(d, "*") {
			bad("acme-domains: %q is not a DNS name (wildcards need DNS-01, not offered)", d)
		}
	}
	if c.TLSTicketRotation != 0 && c.TLSTicketRotation < time.Minute {
		bad("tls-ticket-rotation: at least 1m (or 0: never)")
	}
	if c.H2MaxStreams < 0 || c.H2MaxStreams > 10000 {
		bad("h2-max-concurrent-streams: between 0 (no HTTP/2) and 10000")
	}
	if c.H2MaxHeldBytes < 1<<20 {
		bad("h2-max-held-bytes: at least 1048576 (1 MiB; got %d)", c.H2MaxHeldBytes)
	}
	for _, p := range c.ProxyProtocolFrom {
		if p.Bits() == 0 {
			bad("proxy-protocol-from: %s would require a PROXY header from every client; name the balancers' addresses", p)
		}
	}
	if c.Consul != "" && c.Rules != "" {
		bad("rules: --rules and --consul are exclusive (rules come from one place)")
	}
	if c.Consul != "" && c.Hosts != "" {
		bad("hosts: --hosts and --consul are exclusive (the host table comes from one place: regionctl hosts push)")
	}
	if c.Redis == "" && c.RedisMode != limiter.ModeStandalone {
		bad("redis-mode: %s needs --redis", c.RedisMode)
	}
	switch {
	case c.KeySaltFile != "" || c.AdminTokenFile != "" || c.ConsulTokenFile != "" || c.RedisPasswordFile != "":
		bad("secret files: not read (use ParseFlags)")
	case c.Redis != "" && c.KeySalt == "":
		bad("key-salt: required with --redis (EDGEGUARD_KEY_SALT or --key-salt-file; the same on every edge of the region)")
	case c.KeySalt != "" && len(c.KeySalt) < minKeySalt:
		bad("key-salt: must be at least %d characters (got %d)", minKeySalt, len(c.KeySalt))
	}
	switch {
	case len(c.Origins) == 0 && !c.DemoOrigin:
		bad("origin: required (--origin URL; --demo-origin for the built-in demo)")
	case len(c.Origins) > 0 && c.DemoOrigin:
		bad("origin: --origin and --demo-origin are exclusive")
	}
	if c.OriginTLSServerName != "" || c.OriginCAFile != "" || c.OriginTLSInsecureSkipVerify {
		if !slices.ContainsFunc(c.Origins, func(o string) bool { return strings.HasPrefix(strings.ToLower(o), "https://") }) {
			bad("origin-tls-server-name, origin-ca-file, origin-tls-insecure-skip-verify: set, but no --origin is https")
		}
	}
	if c.OriginCAFile != "" && c.OriginTLSInsecureSkipVerify {
		bad("origin-ca-file: exclusive with --origin-tls-insecure-skip-verify (which verifies nothing)")
	}
	if n := c.OriginTLSServerName; n != "" && (strings.ContainsAny(n, ":[]") || !UsableHost([]byte(n))) {
		bad("origin-tls-server-name: %q is not a host name", c.OriginTLSServerName)
	}
	for _, p := range c.TrustedProxies {
		if p.Bits() == 0 && !c.TrustAllProxies {
			bad("trusted-proxies: %s trusts every address, so any client could set its own identity (add --trust-all-proxies if that is meant)", p)
		}
	}
	if _, err := accesslog.ParseFormat(c.AccessLogFormat); err != nil {
		bad("access-log-format: %v", err)
	}
	if !(c.TraceSampleRatio >= 0 && c.TraceSampleRatio <= 1) {
		bad("trace-sample-ratio: must be in [0, 1] (got %v)", c.TraceSampleRatio)
	}
	if c.OTLPEndpoint != "" {
		if u, err := url.Parse(c.OTLPEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("otlp-endpoint: want an http(s) URL such as http://127.0.0.1:4318/v1/traces (got %q)", c.OTLPEndpoint)
		}
	}
	if !(c.AccessLogSample >= 0 && c.AccessLogSample <= 1) {
		bad("access-log-sample: must be in [0, 1] (got %v)", c.AccessLogSample)
	}
	if _, err := pathsem.Parse(c.PathSemantics); err != nil {
		bad("path-semantics: %v", err)
	}
	if c.DefaultHost != "" && !UsableHost([]byte(c.DefaultHost)) {
		bad("default-host: %q is not a host name or address", c.DefaultHost)
	}
	for _, m := range c.AllowMethods {
		if RefusedMethod([]byte(m)) != m {
			bad("allow-methods: %q is not refused by default (only CONNECT and TRACE are)", m)
		}
	}
	if c.OriginTimeout < 0 {
		bad("origin-timeout: must be ≥ 0 (got %s; 0 = no bound)", c.OriginTimeout)
	}
	for name, d := range map[string]time.Duration{"redis-timeout": c.RedisTimeout, "origin-dial-timeout": c.OriginDialTimeout,
		"origin-header-timeout": c.OriginHeaderTimeout, "origin-read-idle-timeout": c.OriginReadIdleTimeout, "read-timeout": c.ReadTimeout, "write-timeout": c.WriteTimeout, "idle-timeout": c.IdleTimeout, "shutdown-timeout": c.ShutdownTimeout, "tunnel-idle-timeout": c.TunnelIdleTimeout,
		"origin-concurrency-queue-timeout": c.OriginConcurrencyQueueTimeout} {
		if d <= 0 {
			bad("%s: must be > 0 (got %s)", name, d)
		}
	}
	if c.DrainDelay < 0 {
		bad("drain-delay: must be ≥ 0 (got %s)", c.DrainDelay)
	}
	for name, n := range map[string]int{"nodes-in-region": c.NodesInRegion, "nodes-in-pop": c.NodesInPoP, "workers": c.Workers,
		"max-header-bytes": c.MaxHeaderBytes, "max-body-bytes": c.MaxBodyBytes, "prefilter-size": c.PrefilterSize} {
		if n < 1 {
			bad("%s: must be ≥ 1 (got %d)", name, n)
		}
	}
	for name, n := range map[string]int{"max-conns-per-ip": c.MaxConnsPerIP, "origin-max-conns": c.OriginMaxConns, "max-tunnels": c.MaxTunnels,
		"origin-concurrency-limit": c.OriginConcurrencyLimit, "origin-concurrency-queue": c.OriginConcurrencyQueue} {
		if n < 0 {
			bad("%s: must be ≥ 0 (got %d)", name, n)
		}
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		bad("ipv6-prefix: must be in 1..128 (got %d)", c.IPv6Prefix)
	}
	if c.Region == "" || c.PoP == "" {
		bad("region and pop: required")
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		bad("log-level: %v", err)
	}
	errs = append(errs, c.RLS.problems(c.Consul != "")...)
	return errors.Join(errs...)
}

// minKeySalt is the shortest salt accepted: short enough to type, long
// enough that guessing it is no shortcut to enumerating addresses.
const minKeySalt = 16

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

type modeFlag limiter.Mode

func (m *modeFlag) String() string { return string(*m) }
func (m *modeFlag) Set(v string) error {
	mode, err := limiter.ParseMode(v)
	*m = modeFlag(mode)
	return err
}

type failFlag limiter.FailMode

func (f *failFlag) String() string { return string(*f) }
func (f *failFlag) Set(v string) error {
	mode, err := limiter.ParseFailMode(v)
	*f = failFlag(mode)
	return err
}

// methodsFlag is a list of upper-cased method names.
type methodsFlag []string

func (m *methodsFlag) String() string { return strings.Join(*m, ",") }
func (m *methodsFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.ToUpper(strings.TrimSpace(s)); s != "" {
			*m = append(*m, s)
		}
	}
	return nil
}

type prefixesFlag []netip.Prefix

func (p *prefixesFlag) String() string {
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// Set accepts CIDRs and bare addresses (a /32 or /128). IPv4-mapped IPv6
// forms (::ffff:10.0.0.1/128) become the IPv4 prefix they mean: peers are
// compared unmapped, so the mapped form would never match.
func (p *prefixesFlag) Set(v string) error {
	var errs []error
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%q is not an address or CIDR", s))
				continue
			}
			*p = append(*p, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q is not a CIDR", s))
			continue
		}
		if pr.Addr().Is4In6() {
			if pr.Bits() < 96 {
				errs = append(errs, fmt.Errorf("%q: an IPv4-mapped prefix must be /96 or longer", s))
				continue
			}
			pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
		}
		*p = append(*p, pr.Masked())
	}
	return errors.Join(errs...)
}

// Reference is docs/reference/flags.md: every setting as a flag, its
// environment variable, its default as --help says it, and its meaning.
func Reference() string {
	var b strings.Builder
	b.WriteString("# Edge settings\n\nGenerated from the edge's flags (`go test ./internal/edge -run TestReferenceDocs -update-reference`).\n" +
		"Each is a flag (`--name`), an environment variable (`EDGEGUARD_NAME`) and a key of the `--config` file (`name:`);\n" +
		"the command line wins over the environment, which wins over the file. Secrets are refused on the command line.\n\n" +
		"| flag | variable | default | meaning |\n|---|---|---|---|\n")
	c := DefaultConfig()
	newFlagSet(&c, io.Discard).VisitAll(func(f *flag.Flag) {
		def := "`" + flaghelp.Default(f, displayDefaults) + "`"
		fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", f.Name, EnvName(f.Name), def, strings.ReplaceAll(f.Usage, "|", "\\|"))
	})
	return b.String()
}
