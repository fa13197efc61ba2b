package edge

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func limiterFailMode(t *testing.T, s string) limiter.FailMode {
	m, err := limiter.ParseFailMode(s)
	require.NoError(t, err)
	return m
}
