package origin

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// ErrInvalidConfig is wrapped by every configuration problem so callers can
// tell a refused setting from other failures.
var ErrInvalidConfig = errors.New("invalid origin config")

// Defaults: New applies them to zero fields, except HealthCheckInterval,
// whose zero means "no active checks"; DefaultConfig carries them all.
const (
	DefaultDialTimeout         = time.Second
	DefaultHeaderTimeout       = 10 * time.Second
	DefaultReadIdleTimeout     = 60 * time.Second
	DefaultMaxConnsPerHost     = 512
	DefaultHealthCheckInterval = 2 * time.Second
	DefaultHealthCheckPath     = "/"
	DefaultUnhealthyAfter      = 3
	DefaultEjectFor            = 30 * time.Second
	DefaultPool                = "default"
)

// Config says where the origins are and how hard to try them. Start from
// DefaultConfig: zero fields take the defaults, but a zero
// HealthCheckInterval turns active health checks off.
type Config struct {
	// Pool names the pool in metrics (the pool label) and logs: up to 64
	// letters, digits, '.', '_' and '-'; "" means DefaultPool.
	Pool string `yaml:"pool"`
	// URLs lists the origins, e.g. "http://10.0.0.5:8080" or
	// "https://origin.internal". Only scheme and host:port are used: the
	// client's path is forwarded as is, so a path other than "/" would be
	// silently ignored and is refused instead.
	URLs []string `yaml:"urls"`
	// DialTimeout bounds establishing one TCP connection. Kept short so a
	// black-holed origin is detected long before HeaderTimeout.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// HeaderTimeout bounds the exchange up to the origin's response
	// header: connecting, sending the request (its body included) and the
	// origin's think time. Past it the client gets a 504.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// ReadIdleTimeout bounds each wait for more of the response body once
	// the header is in: an origin silent for longer ends the response
	// (the client sees it cut short; its status is already sent). A stream
	// that keeps sending lives as long as it sends.
	ReadIdleTimeout time.Duration `yaml:"read_idle_timeout"`
	// Timeout, when not 0, bounds the whole exchange, body included: a
	// response not over by then is cut short (504 if its header is not in
	// yet). 0, the default, sets no such bound: long downloads, server-sent
	// events and long polls last as long as both sides keep moving.
	Timeout time.Duration `yaml:"timeout"`
	// MaxConnsPerHost caps connections to each origin. Requests beyond it
	// fail at once with a 503 and Retry-After rather than queue behind a
	// slow origin; size it to the requests the caller runs at once.
	MaxConnsPerHost int `yaml:"max_conns_per_host"`
	// MaxRequestBodySize caps a streamed client body (0 = no cap): past it
	// the exchange stops and the client gets 413. A body with a declared
	// length is the caller's to check before Serve.
	MaxRequestBodySize int `yaml:"max_request_body_size"`
	// HealthCheckInterval is how often every origin is probed; 0 disables
	// active checks, leaving only passive detection from real traffic (an
	// origin that leaves rotation then returns when a request tries it
	// after EjectFor, or when every origin is out and it is tried as the
	// last resort).
	HealthCheckInterval time.Duration `yaml:"health_check_interval"`
	// HealthCheckPath is requested with GET; any status below 500 is
	// healthy, so an origin answering 404 for "/" is still up.
	HealthCheckPath string `yaml:"health_check_path"`
	// UnhealthyAfter is how many consecutive failures (connection errors,
	// TLS handshake failures or timeouts of real requests, or failed active
	// checks) take an origin out of rotation. One successful check, or one
	// successful request on probation (EjectFor), brings it back.
	UnhealthyAfter int `yaml:"unhealthy_after"`
	// RewriteHost sends the origin's own host:port as Host instead of the
	// client's. Off by default: a CDN origin usually serves many sites and
	// routes on the Host the client asked for.
	RewriteHost bool `yaml:"rewrite_host"`
	// EjectFor is how long an origin that real traffic took out of
	// rotation (UnhealthyAfter failures in a row) stays out before it is
	// tried again by a request, whether or not active checks run: it is
	// then on probation, and the next request goes to it (one request per
	// EjectFor). A success brings it back into rotation; a failure ejects
	// it again, each ejection twice as long as the one before, up to
	// 8 × EjectFor, until it is back in rotation. 0 means DefaultEjectFor.
	EjectFor time.Duration `yaml:"eject_for"`
	// TLS is how an https origin is reached. Verification is on unless
	// InsecureSkipVerify says otherwise.
	TLS TLSConfig `yaml:"tls"`
	// Concurrency bounds the pool's requests in flight (none by default):
	// past it a request waits in the pool's own short queue, or is refused
	// with 503 at once, before it takes one of the edge's workers, so a
	// slow pool is held where it is slow (see shedder.PoolLimitConfig).
	Concurrency shedder.PoolLimitConfig `yaml:"-"`
}

// TLSConfig is the TLS to an https origin.
type TLSConfig struct {
	// ServerName is sent as SNI and verified against the origin's
	// certificate; "" means the URL's host name.
	ServerName string `yaml:"server_name"`
	// CAPEM is a PEM bundle of the CAs trusted for the origin's
	// certificate; empty means the system's roots.
	CAPEM []byte `yaml:"ca_pem"`
	// InsecureSkipVerify accepts any certificate the origin shows. Off by
	// default; for an origin whose certificate cannot be verified at all.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Validate reports every problem at once, each naming its field, so an
// operator fixes a bad config in one round trip. Zero values are valid:
// they mean "use the default".
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	if err := c.Concurrency.Validate(); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			field, msg, _ := strings.Cut(e.Error(), ": ")
			bad("concurrency."+field, "%s", msg)
		}
	}
	if !validPoolName(c.Pool) {
		bad("pool", "must be up to 64 letters, digits, '.', '_' or '-', got %q", c.Pool)
	}
	if len(c.URLs) == 0 {
		bad("urls", "at least one origin is required")
	}
	seen := make(map[string]int, len(c.URLs))
	for i, raw := range c.URLs {
		field := fmt.Sprintf("urls[%d]", i)
		u, err := parseOriginURL(raw)
		if err != nil {
			bad(field, "%v", err)
			continue
		}
		key := u.Scheme + "://" + strings.ToLower(u.Host)
		if j, dup := seen[key]; dup {
			bad(field, "duplicates urls[%d] (%s)", j, raw)
			continue
		}
		seen[key] = i
	}
	if c.DialTimeout < 0 {
		bad("dial_timeout", "must be >= 0 (0 means %v), got %v", DefaultDialTimeout, c.DialTimeout)
	}
	if c.HeaderTimeout < 0 {
		bad("header_timeout", "must be >= 0 (0 means %v), got %v", DefaultHeaderTimeout, c.HeaderTimeout)
	}
	if c.ReadIdleTimeout < 0 {
		bad("read_idle_timeout", "must be >= 0 (0 means %v), got %v", DefaultReadIdleTimeout, c.ReadIdleTimeout)
	}
	if c.Timeout < 0 {
		bad("timeout", "must be >= 0 (0 means none), got %v", c.Timeout)
	}
	if c.MaxConnsPerHost < 0 {
		bad("max_conns_per_host", "must be >= 0 (0 means %d), got %d", DefaultMaxConnsPerHost, c.MaxConnsPerHost)
	}
	if c.MaxRequestBodySize < 0 {
		bad("max_request_body_size", "must be >= 0 (0 means no limit), got %d", c.MaxRequestBodySize)
	}
	if c.HealthCheckInterval < 0 {
		bad("health_check_interval", "must be >= 0 (0 disables active checks), got %v", c.HealthCheckInterval)
	}
	if c.HealthCheckPath != "" && !strings.HasPrefix(c.HealthCheckPath, "/") {
		bad("health_check_path", "must start with '/', got %q", c.HealthCheckPath)
	}
	if c.UnhealthyAfter < 0 {
		bad("unhealthy_after", "must be >= 0 (0 means %d), got %d", DefaultUnhealthyAfter, c.UnhealthyAfter)
	}
	if c.EjectFor < 0 {
		bad("eject_for", "must be >= 0 (0 means %v), got %v", DefaultEjectFor, c.EjectFor)
	}
	if n := c.TLS.ServerName; n != "" && (len(n) > 253 || strings.ContainsAny(n, " \t\r\n:/[]@")) {
		bad("tls.server_name", "must be a host name without a port, got %q", n)
	}
	if len(c.TLS.CAPEM) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(c.TLS.CAPEM) {
			bad("tls.ca_pem", "no PEM certificate in it")
		}
	}
	return errors.Join(errs...)
}

// DefaultConfig returns every default, active health checks included; a
// config loader overlays the operator's settings on it.
func DefaultConfig() Config {
	return Config{
		Pool:                DefaultPool,
		DialTimeout:         DefaultDialTimeout,
		HeaderTimeout:       DefaultHeaderTimeout,
		ReadIdleTimeout:     DefaultReadIdleTimeout,
		MaxConnsPerHost:     DefaultMaxConnsPerHost,
		HealthCheckInterval: DefaultHealthCheckInterval,
		HealthCheckPath:     DefaultHealthCheckPath,
		UnhealthyAfter:      DefaultUnhealthyAfter,
		EjectFor:            DefaultEjectFor,
	}
}

// withDefaults fills zero fields. HealthCheckInterval and Timeout are
// left alone: their 0 turns active checks and the overall bound off.
func (c Config) withDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = DefaultHeaderTimeout
	}
	if c.ReadIdleTimeout == 0 {
		c.ReadIdleTimeout = DefaultReadIdleTimeout
	}
	if c.MaxConnsPerHost == 0 {
		c.MaxConnsPerHost = DefaultMaxConnsPerHost
	}
	if c.HealthCheckPath == "" {
		c.HealthCheckPath = DefaultHealthCheckPath
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if c.EjectFor == 0 {
		c.EjectFor = DefaultEjectFor
	}
	if c.Pool == "" {
		c.Pool = DefaultPool
	}
	return c
}

// validPoolName keeps a pool name a short, printable label value ("" is
// the default pool's).
func validPoolName(name string) bool {
	if len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// parseOriginURL accepts only what the proxy can honour: a scheme, a host
// and nothing that would be silently dropped.
func parseOriginURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parsing %q: %w", raw, err)
	}
	var problems []string
	if u.Scheme != "http" && u.Scheme != "https" {
		problems = append(problems, fmt.Sprintf("scheme must be http or https, got %q", u.Scheme))
	}
	if u.Host == "" || u.Hostname() == "" {
		problems = append(problems, "host is required")
	}
	if u.Path != "" && u.Path != "/" {
		problems = append(problems, fmt.Sprintf("path must be empty or \"/\", got %q", u.Path))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		problems = append(problems, "query and fragment are not allowed")
	}
	if u.User != nil {
		problems = append(problems, "credentials in the URL are not allowed")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%q: %s", raw, strings.Join(problems, "; "))
	}
	return u, nil
}
