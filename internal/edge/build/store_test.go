package build

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A Redis URL in a message keeps its host but never its password or query.
func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"password", "redis://user:s3cret@redis.example:6379/0", "redis://user:xxxxx@redis.example:6379/0"},
		{"query", "rediss://redis.example:6380/?password=s3cret", "rediss://redis.example:6380/"},
		{"plain", "redis://127.0.0.1:6379", "redis://127.0.0.1:6379"},
		{"unparsable", "redis://[::1:6379", "(unparsable URL)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := redactURL(tc.in)
			require.Equal(t, tc.want, got)
			require.NotContains(t, got, "s3cret")
		})
	}
}
