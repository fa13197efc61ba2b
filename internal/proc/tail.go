package proc

import (
	"fmt"
	"os"
	"strings"
)

// TailLines is how many lines of a log Tail returns: enough for Redis or
// Consul to say why they refused to start.
const TailLines = 25

// Tail returns the last TailLines lines of the log at path.
func Tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > TailLines {
		lines = lines[len(lines)-TailLines:]
	}
	return strings.Join(lines, "\n")
}

// WithTail appends the end of the log at path to err.
func WithTail(err error, path string) error {
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, path, Tail(path))
}
