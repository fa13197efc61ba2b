package edge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("unknown level %q (want debug, info, warn or error)", s)
	}
	return l, nil
}

// NewLogger writes JSON lines at the configured level.
func NewLogger(w io.Writer, level string) *slog.Logger {
	l, err := parseLevel(level)
	if err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

// redisLogger routes go-redis's own messages (failed dials while Redis is
// down) to slog at debug: the limiter's metrics and breaker logs say it once.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, "redis client", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
