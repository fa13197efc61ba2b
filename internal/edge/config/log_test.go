package config

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	var buf bytes.Buffer
	NewLogger(&buf, "info").Info("x", "delay", 1500*time.Millisecond)
	require.Contains(t, buf.String(), `"delay":"1.5s"`)
}
