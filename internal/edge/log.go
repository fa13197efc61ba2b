package edge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

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

// everyLog lets a repeated warning through once, then at most once per
// logEvery, and counts what it held back in between.
type everyLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

const logEvery = 30 * time.Second

// allow reports whether to log now, and how many were held back since the
// last line.
func (e *everyLog) allow(now time.Time) (bool, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < logEvery {
		e.suppressed++
		return false, 0
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return true, n
}

// redisLogger routes go-redis's own messages (failed dials while Redis is
// down) to slog at debug: the limiter's metrics and breaker logs say it once.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, "redis client", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
