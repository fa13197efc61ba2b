package listen

import (
	"fmt"
	"log/slog"
	"strings"
)

// fastHTTPLogger routes fasthttp's own messages (bad requests, timeouts) to slog.
type fastHTTPLogger struct{ Log *slog.Logger }

func (l fastHTTPLogger) Printf(format string, args ...any) {
	l.Log.Debug("fasthttp", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
