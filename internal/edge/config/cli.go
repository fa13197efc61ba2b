package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage marks a command line the flag package could not read: an
// unknown flag, a flag without its value, a value of the wrong kind.
var ErrUsage = errors.New("bad command line")

type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// CommandLineError handles --help and a command line that cannot be read;
// done is false for any other outcome.
func CommandLineError(err error, prog string, usage *bytes.Buffer, stdout, stderr io.Writer) (code int, done bool) {
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = stdout.Write(usage.Bytes())
		return 0, true
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the list of flags.\n", prog, err, prog)
		return 2, true
	}
	return 0, false
}
