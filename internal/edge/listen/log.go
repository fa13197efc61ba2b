package listen

import (
	"fmt"
	"log/slog"
	"strings"
)

// FastHTTPLogger routes fasthttp's own messages (bad requests, timeouts) to slog.
type FastHTTPLogger struct{ Log *slog.Logger }

func (l FastHTTPLogger) Printf(format string, args ...any) {
	l.Log.Debug("fasthttp", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
