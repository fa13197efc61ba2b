package limiter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A region's dial map: clients keep the address a Redis announces (its URL,
// a Cluster's slot map, a Sentinel's master) and connect to the mapped one,
// in plain TCP and in TLS, where the certificate is checked against the
// announced name, not the mapped address. Names under .invalid never
// resolve (RFC 6761): a client that dialled them as such would fail.
func TestDialMap(t *testing.T) {
	ca := testenv.NewCA(t)
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{TLS: new(ca.Issue(t, "ecdsa", "redis.region-b.invalid"))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	const announced, announcedTLS = "redis.region-b.invalid:6379", "redis.region-b.invalid:6380"
	dial := DialMap{announced: srv.Addr, announcedTLS: srv.TLSAddr}
	ping := func(t *testing.T, c redis.UniversalClient) error {
		t.Helper()
		t.Cleanup(func() { _ = c.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}

	t.Run("plain", func(t *testing.T) {
		c, err := NewRedisClient("redis://"+announced, ModeStandalone, dial)
		require.NoError(t, err)
		require.NoError(t, ping(t, c))
		c, err = NewRedisClient("redis://"+announced, ModeStandalone)
		require.NoError(t, err)
		var dnsErr *net.DNSError
		require.ErrorAs(t, ping(t, c), &dnsErr, "without the map the announced name is dialled")
	})

	t.Run("tls", func(t *testing.T) {
		// rediss:// from the URL (go-redis trusts the system's roots only, so
		// the certificate is not verified here: skip_verify) …
		c, err := NewRedisClient("rediss://"+announcedTLS+"?skip_verify=true", ModeStandalone, dial)
		require.NoError(t, err)
		require.NoError(t, ping(t, c))
		// … and the dialer with a TLS configuration that verifies: the
		// name checked is the announced one.
		for name, want := range map[string]bool{"redis.region-b.invalid": true, "127.0.0.1": false} {
			d := dialer([]DialMap{dial}, time.Second, &tls.Config{ServerName: name, RootCAs: ca.Pool, MinVersion: tls.VersionTLS12})
			err := ping(t, redis.NewClient(&redis.Options{Addr: announcedTLS, Dialer: d, MaxRetries: -1}))
			if want {
				require.NoError(t, err, name)
				continue
			}
			var unknown x509.HostnameError
			require.ErrorAs(t, err, &unknown, "a certificate for the announced name does not pass for %s", name)
		}
	})
}
