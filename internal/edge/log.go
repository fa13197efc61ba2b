package edge

import (
	"io"
	"log/slog"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// NewLogger writes JSON lines at the configured level, durations as
// strings ("1.5s", not 1500000000).
func NewLogger(w io.Writer, level string) *slog.Logger {
	l, err := config.ParseLevel(level)
	if err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l, ReplaceAttr: durationString}))
}

func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
