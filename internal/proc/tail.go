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
	return LastLines(string(data), TailLines)
}

// LastLines returns the last n lines of s (a command's output, say).
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WithTail appends the end of the log at path to err.
func WithTail(err error, path string) error {
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, path, Tail(path))
}
