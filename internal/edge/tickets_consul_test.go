package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

func TestTLSTicketKeysFromConsul(t *testing.T) {
	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer consul.Close()
	rc := regionClient(t, consul)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	a, _ := startTLSConsulEdge(t, site, consul.HTTPAddr(), nil)
	b, _ := startTLSConsulEdge(t, site, consul.HTTPAddr(), nil)

	// Both edges start the rotation: one creates the keys, both serve them.
	var keys region.TicketKeys
	require.Eventually(t, func() bool {
		var index uint64
		keys, index, err = rc.ReadTicketKeys(context.Background(), "eu-west")
		return err == nil && index != 0
	}, 5*time.Second, 20*time.Millisecond)
	require.Len(t, keys.Keys, 1)
	inForce := func(want time.Time) {
		t.Helper()
		for _, r := range []*running{a, b} {
			require.Eventually(t, func() bool {
				return metricValue(t, r, "edgeguard_tls_ticket_keys_rotated_timestamp_seconds") == float64(want.Unix())
			}, 5*time.Second, 20*time.Millisecond)
		}
	}
	inForce(keys.Rotated)

	// handshake makes a full or resumed handshake on r with cache, and
	// reads one response (a TLS 1.3 ticket comes after the handshake).
	handshake := func(r *running, cache tls.ClientSessionCache) bool {
		t.Helper()
		c, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.ClientSessionCache = cache })
		require.NoError(t, err)
		defer c.Close()
		resp, _ := tlsGet(t, c, bufio.NewReader(c), "shop.example.com", "/")
		require.Equal(t, 200, resp.StatusCode)
		return c.ConnectionState().DidResume
	}
	early := tls.NewLRUClientSessionCache(4)
	require.False(t, handshake(a, early))
	onB := tls.NewLRUClientSessionCache(4)
	require.False(t, handshake(a, onB))
	require.True(t, handshake(b, onB), "a ticket from edge a resumes on edge b")

	// rotate is what the edge that finds a rotation due does (consullink):
	// it reports whether this call rotated the region's keys.
	rotate := func(at time.Time) bool {
		t.Helper()
		done, err := rc.RotateTicketKeys(context.Background(), "eu-west", 24*time.Hour, at)
		require.NoError(t, err)
		return done
	}
	// One rotation (due a day on): a ticket from before still resumes, on
	// either edge.
	rotated := time.Now().Add(25 * time.Hour)
	require.True(t, rotate(rotated))
	require.False(t, rotate(rotated), "done once for the region")
	inForce(rotated)
	keys, _, err = rc.ReadTicketKeys(context.Background(), "eu-west")
	require.NoError(t, err)
	require.Len(t, keys.Keys, 2)
	require.True(t, handshake(b, early), "a ticket from before the rotation resumes after it")

	// After TicketKeysKept rotations the oldest key is gone: its tickets
	// make full handshakes.
	old := tls.NewLRUClientSessionCache(4)
	require.False(t, handshake(a, old))
	for i := range region.TicketKeysKept {
		rotated = rotated.Add(25 * time.Hour)
		require.True(t, rotate(rotated), "rotation %d", i)
	}
	inForce(rotated)
	require.False(t, handshake(a, old))
}
