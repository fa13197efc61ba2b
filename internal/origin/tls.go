package origin

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// errTLS matches every tlsError, as errDial matches dialError: tested with
// errors.Is so the request path allocates no target.
var errTLS = errors.New("TLS handshake with origin")

// tlsError is a failed handshake with an https origin: an unknown CA, a
// certificate for another name, no common protocol version. Nothing of the
// request was sent, so, like a failed dial, it may go to another origin
// whatever its method.
type tlsError struct{ err error }

func (e *tlsError) Error() string        { return "TLS handshake with origin: " + e.err.Error() }
func (e *tlsError) Unwrap() error        { return e.err }
func (e *tlsError) Is(target error) bool { return target == errTLS || target == errDial }

// sessionCacheSize is how many TLS sessions are kept per origin for
// resumption: one per connection the pool may reopen at once is plenty.
const sessionCacheSize = 64

// clientTLS builds the tls.Config for the https origin u, once, at New:
// SNI and the verified name are cfg.ServerName, else u's host name; the
// roots are cfg.CAPEM's certificates, else the system's. Verification is
// explicit rather than left to fasthttp's defaults.
func clientTLS(cfg TLSConfig, u *url.URL) (*tls.Config, error) {
	c := &tls.Config{
		ServerName:         cfg.ServerName,
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: cfg.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice, warned about at New
		// A new connection to an origin resumes an earlier session when
		// it can: no certificate chain to verify, one round trip less.
		ClientSessionCache: tls.NewLRUClientSessionCache(sessionCacheSize),
	}
	if c.ServerName == "" {
		c.ServerName = u.Hostname()
	}
	if len(cfg.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAPEM) {
			return nil, fmt.Errorf("%w: tls.ca_pem: no PEM certificate in it", ErrInvalidConfig)
		}
		c.RootCAs = pool
	}
	return c, nil
}

// handshake runs the TLS client handshake over conn within timeout. The
// connection is returned as a *tls.Conn, which fasthttp takes as already
// TLS: the handshake then fails here, as a tlsError, rather than inside
// the first write of a request where it would look like any write error.
func handshake(conn net.Conn, cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	tc := tls.Client(conn, cfg)
	err := conn.SetDeadline(time.Now().Add(timeout))
	if err == nil {
		err = tc.Handshake()
	}
	if err == nil {
		err = conn.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = conn.Close()
		return nil, &tlsError{err: err}
	}
	return tc, nil
}
