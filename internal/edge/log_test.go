package edge

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEveryLog(t *testing.T) {
	var e everyLog
	t0 := time.Unix(1000, 0)
	ok, n := e.allow(t0)
	require.True(t, ok)
	require.Zero(t, n)
	for i := 1; i <= 5; i++ {
		ok, _ = e.allow(t0.Add(time.Duration(i) * time.Second))
		require.False(t, ok, "within 30 s of the last line")
	}
	ok, n = e.allow(t0.Add(logEvery))
	require.True(t, ok)
	require.Equal(t, 5, n, "the held-back lines are counted")
}

func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	var buf bytes.Buffer
	NewLogger(&buf, "info").Info("x", "delay", 1500*time.Millisecond)
	require.Contains(t, buf.String(), `"delay":"1.5s"`)
}
