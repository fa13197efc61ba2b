package regionctl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// codedError carries its exit code and, optionally, the one line to print.
type codedError struct {
	code     int
	msg      string // "" means err's text
	err      error
	reported bool // already printed (e.g. an error list): print nothing more
}

func (e *codedError) Error() string {
	switch {
	case e.msg != "":
		return e.msg
	case e.err != nil:
		return e.err.Error()
	}
	return fmt.Sprintf("exit code %d", e.code)
}

func (e *codedError) Unwrap() error { return e.err }

func (e *codedError) Is(target error) bool { return target == errReported && e.reported }

// errReported marks errors whose message was already printed.
var errReported = errors.New("reported")

// errReportedUsage is the usage text having been printed to stderr.
var errReportedUsage = &codedError{code: ExitUsage, msg: "no command given (see regionctl --help)", reported: true}

func usagef(format string, args ...any) error {
	return &codedError{code: ExitUsage, msg: fmt.Sprintf(format, args...)}
}

// reported is an error the command already described on stdout.
func reported(code int, msg string) error {
	return &codedError{code: code, msg: msg, reported: true}
}

// invalidf is an invalid document or setting (exit 4).
func invalidf(format string, args ...any) error {
	return &codedError{code: ExitInvalid, msg: fmt.Sprintf(format, args...)}
}

// need turns a permission error into one naming what the token lacks; other
// errors pass unchanged.
func need(err error, what string) error {
	if err != nil && errors.Is(err, region.ErrPermissionDenied) {
		var ce *codedError
		if errors.As(err, &ce) {
			return err
		}
		return &codedError{code: ExitDenied, err: err,
			msg: fmt.Sprintf("permission denied by Consul ACLs (the token lacks %s)", what)}
	}
	return err
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ce *codedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, region.ErrConflict):
		return ExitConflict
	case errors.Is(err, region.ErrPermissionDenied):
		return ExitDenied
	case errors.Is(err, region.ErrUnreachable):
		return ExitUnreachable
	case errors.Is(err, region.ErrUnknownRegion):
		return ExitUnknown
	}
	return ExitError
}

// reasonOf names an exit code in JSON output.
func reasonOf(code int) string {
	switch code {
	case ExitOK:
		return "ok"
	case ExitUsage:
		return "usage"
	case ExitConflict:
		return "conflict"
	case ExitInvalid:
		return "invalid"
	case ExitDenied:
		return "permission_denied"
	case ExitNotConverged:
		return "not_converged"
	case ExitUnreachable:
		return "unreachable"
	case ExitUnknown:
		return "unknown_region"
	case ExitUnreadable:
		return "unreadable"
	case ExitRolledBack:
		return "canary_rolled_back"
	}
	return "error"
}

// message is the one line printed for err (after "regionctl: ").
func (a *app) message(err error) string {
	var ce *codedError
	if errors.As(err, &ce) && ce.msg != "" {
		return ce.msg
	}
	var ru *region.RegionUnreachableError
	if errors.As(err, &ru) {
		return fmt.Sprintf("region %s unreachable: the Consul agent at %s answered, but could not reach the servers of %s: %s (while %s)",
			ru.Region, a.g.consul, ru.Region, ru.Detail, ru.Doing)
	}
	if errors.Is(err, region.ErrUnreachable) {
		doing, detail := split(err, region.ErrUnreachable)
		if doing != "" {
			detail += " (while " + doing + ")"
		}
		return fmt.Sprintf("consul unreachable at %s: %s", a.g.consul, detail)
	}
	return err.Error()
}

// split cuts "doing: <sentinel>: detail" into its two ends.
func split(err, sentinel error) (doing, detail string) {
	s, mark := err.Error(), sentinel.Error()
	i := strings.Index(s, mark)
	if i < 0 {
		return "", s
	}
	doing = strings.TrimSuffix(s[:i], ": ")
	detail = strings.TrimPrefix(s[i+len(mark):], ": ")
	if detail == "" {
		detail = mark
	}
	return doing, detail
}

// combine is the exit code of a multi-region command: the failures' common
// code, or ExitError when they differ.
func combine(codes []int) int {
	out := ExitOK
	for _, c := range codes {
		switch {
		case c == ExitOK:
		case out == ExitOK:
			out = c
		case out != c:
			return ExitError
		}
	}
	return out
}
