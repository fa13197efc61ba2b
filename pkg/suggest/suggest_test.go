package suggest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNearest(t *testing.T) {
	names := []string{"good", "bad", "redis-timeout", "EDGEGUARD_REDIS_TIMEOUT"}
	for _, c := range []struct{ in, want string }{
		{"goood", "good"},
		{"redis-timout", "redis-timeout"},
		{"EDGEGUARD_REDIS_TIMOUT", "EDGEGUARD_REDIS_TIMEOUT"},
		{"Bad", "bad"},
		{"workers", ""},
		{"", ""}, // 3 edits from the nearest: too far
	} {
		require.Equal(t, c.want, Nearest(c.in, names), c.in)
	}
	require.Equal(t, 3, distance("kitten", "sitting"))
}
