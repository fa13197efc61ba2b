package edge

import (
	"bytes"
	"fmt"
	"io"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// ParseCommandLine is config.ParseArgs with the edge's command-line conventions:
// --help prints the usage on stdout (exit 0); a command line that cannot be
// read, or settings that are refused, print what is wrong on stderr, the
// former with a pointer to --help rather than the whole list of flags
// (exit 2). ok is false when the program should exit with code.
func ParseCommandLine(args, environ []string, stdout, stderr io.Writer) (cfg config.Config, code int, ok bool) {
	var usage bytes.Buffer
	cfg, err := config.ParseArgs(args, environ, &usage)
	if code, done := config.CommandLineError(err, "edge", &usage, stdout, stderr); done {
		return cfg, code, false
	}
	if err != nil {
		fmt.Fprintln(stderr, "edge:", err)
		return cfg, 2, false
	}
	return cfg, 0, true
}
