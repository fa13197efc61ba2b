package rlsd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Settings are envoyproxy/ratelimit's environment variables, under the
// names and with the defaults it gives them, as far as this service
// honours them.
type Settings struct {
	Host, DebugHost, GRPCHost string
	Port, DebugPort, GRPCPort int

	GRPCServerUseTLS                    bool
	GRPCServerTLSCert, GRPCServerTLSKey string
	GRPCClientTLSCACert                 string

	LogLevel, LogFormat string

	DisableStats       bool
	UseStatsd          bool
	StatsdHost         string
	StatsdPort         int
	StatsFlushInterval time.Duration
	UsePrometheus      bool
	PrometheusAddr     string
	PrometheusPath     string

	RuntimeRoot, RuntimeSubdirectory, RuntimeAppDirectory string
	RuntimeIgnoreDotFiles, RuntimeWatchRoot               bool

	NearLimitRatio        float64
	LocalCacheSizeInBytes int
	CacheKeyPrefix        string

	LimitResponseHeadersEnabled               bool
	LimitHeader, RemainingHeader, ResetHeader string

	RedisSocketType, RedisType, RedisURL, RedisAuth string
	RedisTLS, RedisTLSSkipHostnameVerification      bool
	RedisPoolSize                                   int
	RedisTimeout, RedisPipelineWindow               time.Duration
	RedisPipelineLimit                              int
	RedisPerSecond                                  bool

	ShadowMode, QuotaMode, MergeDomainConfig bool

	// DrainDelay is edgeguard's own (EDGEGUARD_DRAIN_DELAY, as the edge's
	// --drain-delay): how long health says NOT_SERVING on SIGTERM while
	// calls are still answered.
	DrainDelay time.Duration

	// Unsupported names the variables set in the environment that this
	// service does not honour, sorted.
	Unsupported []string
}

// unsupported are the reference's variables this service reads no value
// from: naming one in the environment is logged once at start. A
// variable is listed only when set to something other than the
// reference's default (a default changes nothing).
var unsupported = map[string]string{
	"GRPC_UDS":                                 "",
	"GRPC_MAX_CONNECTION_AGE":                  "24h",
	"GRPC_MAX_CONNECTION_AGE_GRACE":            "1h",
	"GRPC_CLIENT_TLS_SAN":                      "",
	"CONFIG_TYPE":                              "FILE",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":       "false",
	"CONFIG_GRPC_XDS_NODE_ID":                  "default",
	"CONFIG_GRPC_XDS_NODE_METADATA":            "",
	"CONFIG_GRPC_XDS_SERVER_URL":               "localhost:18000",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS":           "false",
	"USE_DOG_STATSD":                           "false",
	"USE_DOG_STATSD_MOGRIFIERS":                "",
	"EXTRA_TAGS":                               "",
	"PROMETHEUS_MAPPER_YAML":                   "",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "false",
	"EXPIRATION_JITTER_MAX_SECONDS":            "300",
	"BACKEND_TYPE":                             "redis",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT":  "",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED":  "",
	"REDIS_TLS_CLIENT_CERT":                    "",
	"REDIS_TLS_CLIENT_KEY":                     "",
	"REDIS_TLS_CACERT":                         "",
	"REDIS_SENTINEL_AUTH":                      "",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":       "1",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION":     "false",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":             "WAIT",
	"REDIS_STARTUP_INITIAL_INTERVAL":           "",
	"REDIS_STARTUP_MAX_INTERVAL":               "",
	"REDIS_STARTUP_MAX_ELAPSED_TIME":           "",
	"MEMCACHE_HOST_PORT":                       "",
	"MEMCACHE_SRV":                             "",
	"RESPONSE_DYNAMIC_METADATA":                "false",
	"TRACING_ENABLED":                          "false",
}

// unsupportedPrefixes: every variable of these families is unsupported
// (set at all, it is named).
var unsupportedPrefixes = []string{"CONFIG_GRPC_XDS_", "XDS_CLIENT_", "MEMCACHE_", "TRACING_"}

// env reads one environment.
type env struct {
	vars map[string]string
	errs []error
}

func newEnv(environ []string) *env {
	e := &env{vars: map[string]string{}}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			e.vars[k] = v
		}
	}
	return e
}

func (e *env) str(name, def string) string {
	if v, ok := e.vars[name]; ok {
		return v
	}
	return def
}

func (e *env) int(name string, def int) int {
	v, ok := e.vars[name]
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not an integer", name, v))
	}
	return n
}

func (e *env) bool(name string, def bool) bool {
	v, ok := e.vars[name]
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a boolean", name, v))
	}
	return b
}

// duration reads a Go duration ("10s", "0"), as the reference's reader.
func (e *env) duration(name string, def time.Duration) time.Duration {
	v, ok := e.vars[name]
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a duration", name, v))
		return def // named once, as not a duration
	}
	return d
}

func (e *env) float(name string, def float64) float64 {
	v, ok := e.vars[name]
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a number", name, v))
	}
	return f
}

// FromEnv reads the settings from an environment (KEY=VALUE strings);
// an unparsable value is an error naming every one.
func FromEnv(environ []string) (Settings, error) {
	e := newEnv(environ)
	s := Settings{
		Host:      e.str("HOST", "0.0.0.0"),
		Port:      e.int("PORT", 8080),
		DebugHost: e.str("DEBUG_HOST", "0.0.0.0"),
		DebugPort: e.int("DEBUG_PORT", 6070),
		GRPCHost:  e.str("GRPC_HOST", "0.0.0.0"),
		GRPCPort:  e.int("GRPC_PORT", 8081),

		GRPCServerUseTLS:    e.bool("GRPC_SERVER_USE_TLS", false),
		GRPCServerTLSCert:   e.str("GRPC_SERVER_TLS_CERT", ""),
		GRPCServerTLSKey:    e.str("GRPC_SERVER_TLS_KEY", ""),
		GRPCClientTLSCACert: e.str("GRPC_CLIENT_TLS_CACERT", ""),

		LogLevel:  e.str("LOG_LEVEL", "WARN"),
		LogFormat: e.str("LOG_FORMAT", "text"),

		DisableStats:       e.bool("DISABLE_STATS", false),
		UseStatsd:          e.bool("USE_STATSD", true),
		StatsdHost:         e.str("STATSD_HOST", "localhost"),
		StatsdPort:         e.int("STATSD_PORT", 8125),
		StatsFlushInterval: e.duration("STATS_FLUSH_INTERVAL", 10*time.Second),
		UsePrometheus:      e.bool("USE_PROMETHEUS", false),
		PrometheusAddr:     e.str("PROMETHEUS_ADDR", ":9090"),
		PrometheusPath:     e.str("PROMETHEUS_PATH", "/metrics"),

		RuntimeRoot:           e.str("RUNTIME_ROOT", "/srv/runtime_data/current"),
		RuntimeSubdirectory:   e.str("RUNTIME_SUBDIRECTORY", ""),
		RuntimeAppDirectory:   e.str("RUNTIME_APPDIRECTORY", "config"),
		RuntimeIgnoreDotFiles: e.bool("RUNTIME_IGNOREDOTFILES", false),
		RuntimeWatchRoot:      e.bool("RUNTIME_WATCH_ROOT", true),

		NearLimitRatio:        e.float("NEAR_LIMIT_RATIO", 0.8),
		LocalCacheSizeInBytes: e.int("LOCAL_CACHE_SIZE_IN_BYTES", 0),
		CacheKeyPrefix:        e.str("CACHE_KEY_PREFIX", ""),

		LimitResponseHeadersEnabled: e.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false),
		LimitHeader:                 e.str("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
		RemainingHeader:             e.str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
		ResetHeader:                 e.str("LIMIT_RESET_HEADER", "RateLimit-Reset"),

		RedisSocketType:                  e.str("REDIS_SOCKET_TYPE", "unix"),
		RedisType:                        e.str("REDIS_TYPE", "SINGLE"),
		RedisURL:                         e.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
		RedisAuth:                        e.str("REDIS_AUTH", ""),
		RedisTLS:                         e.bool("REDIS_TLS", false),
		RedisTLSSkipHostnameVerification: e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false),
		RedisPoolSize:                    e.int("REDIS_POOL_SIZE", 10),
		RedisTimeout:                     e.duration("REDIS_TIMEOUT", 10*time.Second),
		RedisPipelineWindow:              e.duration("REDIS_PIPELINE_WINDOW", 0),
		RedisPipelineLimit:               e.int("REDIS_PIPELINE_LIMIT", 0),
		RedisPerSecond:                   e.bool("REDIS_PERSECOND", false),

		ShadowMode:        e.bool("SHADOW_MODE", false),
		QuotaMode:         e.bool("QUOTA_MODE", false),
		MergeDomainConfig: e.bool("MERGE_DOMAIN_CONFIG", false),

		DrainDelay: e.duration("EDGEGUARD_DRAIN_DELAY", DefaultDrainDelay),
	}
	if s.DrainDelay < 0 {
		e.errs = append(e.errs, fmt.Errorf("EDGEGUARD_DRAIN_DELAY=%v: must be ≥ 0", s.DrainDelay))
	}
	if s.DisableStats {
		// As the reference: no stats sink at all, whatever else is set.
		s.UseStatsd, s.UsePrometheus = false, false
	}
	if s.NearLimitRatio < 0 || s.NearLimitRatio > 1 {
		e.errs = append(e.errs, fmt.Errorf("NEAR_LIMIT_RATIO=%v: want a ratio from 0 to 1", s.NearLimitRatio))
	}
	if s.RedisTimeout <= 0 {
		// The reference's radix reads 0 as no timeout at all; here it is
		// every decision's deadline on Redis, which must end.
		e.errs = append(e.errs, fmt.Errorf("REDIS_TIMEOUT=%v: want a positive duration (a decision's wait on Redis, and the dial timeout)", s.RedisTimeout))
	}
	if s.StatsFlushInterval <= 0 {
		e.errs = append(e.errs, fmt.Errorf("STATS_FLUSH_INTERVAL=%v: want a positive duration", s.StatsFlushInterval))
	}
	if s.GRPCServerUseTLS && (s.GRPCServerTLSCert == "" || s.GRPCServerTLSKey == "") {
		e.errs = append(e.errs, errors.New("GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"))
	}
	for k, v := range e.vars {
		def, listed := unsupported[k]
		if listed && !strings.EqualFold(v, def) && v != "" {
			s.Unsupported = append(s.Unsupported, k)
			continue
		}
		if !listed && slices.ContainsFunc(unsupportedPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			s.Unsupported = append(s.Unsupported, k)
		}
	}
	slices.Sort(s.Unsupported)
	return s, errors.Join(e.errs...)
}

// ConfigDir is the reference's configuration directory:
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (s Settings) ConfigDir() string {
	return filepath.Join(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory)
}

// WatchDir is the directory whose changes reload the configuration: the
// runtime root with RUNTIME_WATCH_ROOT (where a symlink swap of the whole
// tree happens), else the configuration directory.
func (s Settings) WatchDir() string {
	if s.RuntimeWatchRoot {
		return s.RuntimeRoot
	}
	return s.ConfigDir()
}

// PerSecondVars names the REDIS_PERSECOND* variables set: a second Redis
// this service does not use.
func PerSecondVars(environ []string) []string {
	var out []string
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "REDIS_PERSECOND") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Redis is the go-redis URL and mode the REDIS_* settings describe:
// REDIS_SOCKET_TYPE tcp or unix, REDIS_TYPE SINGLE, CLUSTER ("host:port"
// seeds, comma separated) or SENTINEL ("mastername,host:port,..." with
// the sentinels' addresses), REDIS_AUTH ("password" or
// "user:password"), REDIS_TLS, REDIS_POOL_SIZE, REDIS_TIMEOUT (dialing;
// it is also the limiter's store deadline, set by buildLimiter).
func (s Settings) Redis() (string, limiter.Mode, error) {
	var mode limiter.Mode
	switch strings.ToUpper(s.RedisType) {
	case "SINGLE", "":
		mode = limiter.ModeStandalone
	case "CLUSTER":
		mode = limiter.ModeCluster
	case "SENTINEL":
		mode = limiter.ModeSentinel
	default:
		return "", "", fmt.Errorf("REDIS_TYPE=%q: want SINGLE, CLUSTER or SENTINEL", s.RedisType)
	}
	parts := strings.Split(s.RedisURL, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	var master string
	if mode == limiter.ModeSentinel {
		if len(parts) < 2 || parts[0] == "" {
			return "", "", fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=SENTINEL wants \"mastername,host:port[,host:port...]\"", s.RedisURL)
		}
		master, parts = parts[0], parts[1:]
	}
	q := url.Values{}
	q.Set("pool_size", strconv.Itoa(s.RedisPoolSize))
	q.Set("dial_timeout", s.RedisTimeout.String())
	if master != "" {
		q.Set("master_name", master)
	}
	if s.RedisTLS && s.RedisTLSSkipHostnameVerification {
		q.Set("skip_verify", "true")
	}
	u := &url.URL{Scheme: "redis"}
	if s.RedisTLS {
		u.Scheme = "rediss"
	}
	if s.RedisAuth != "" {
		if user, pass, ok := strings.Cut(s.RedisAuth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", s.RedisAuth)
		}
	}
	switch strings.ToLower(s.RedisSocketType) {
	case "unix":
		if mode != limiter.ModeStandalone || len(parts) != 1 {
			return "", "", errors.New("REDIS_SOCKET_TYPE=unix: a single socket path with REDIS_TYPE=SINGLE")
		}
		u.Scheme, u.Path = "unix", parts[0]
		q.Del("skip_verify")
	case "tcp":
		for _, p := range parts {
			if _, _, err := net.SplitHostPort(p); err != nil {
				return "", "", fmt.Errorf("REDIS_URL=%q: %q is not host:port", s.RedisURL, p)
			}
		}
		u.Host = parts[0]
		for _, p := range parts[1:] {
			q.Add("addr", p)
		}
	default:
		return "", "", fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", s.RedisSocketType)
	}
	u.RawQuery = q.Encode()
	return u.String(), mode, nil
}
