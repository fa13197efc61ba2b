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

// ParseCommandLine is ParseArgs with the edge's command-line conventions:
// --help prints the usage on stdout (exit 0); a command line that cannot be
// read, or settings that are refused, print what is wrong on stderr, the
// former with a pointer to --help rather than the whole list of flags
// (exit 2). ok is false when the program should exit with code.
func ParseCommandLine(args, environ []string, stdout, stderr io.Writer) (cfg Config, code int, ok bool) {
	var usage bytes.Buffer
	cfg, err := ParseArgs(args, environ, &usage)
	if code, done := CommandLineError(err, "edge", &usage, stdout, stderr); done {
		return cfg, code, false
	}
	if err != nil {
		fmt.Fprintln(stderr, "edge:", err)
		return cfg, 2, false
	}
	return cfg, 0, true
}

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
