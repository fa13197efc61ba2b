// Package regionctl is the logic of the regionctl command: it validates,
// diffs, pushes and rolls back edgeguard rule documents and shedder settings
// in Consul KV, region by region, and shows which rules each region's edges
// run (from the Consul catalog).
//
// Main is the whole program, so tests run it in-process against real Consul
// agents; cmd/regionctl only calls os.Exit(regionctl.Main(...)).
package regionctl

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/edgeguard/edgeguard/internal/flaghelp"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Exit codes, documented in usage and README.md.
const (
	ExitOK           = 0 // success (also: status with no edges)
	ExitError        = 1 // any other failure
	ExitUsage        = 2 // bad command line
	ExitConflict     = 3 // check-and-set lost: the document changed since it was read
	ExitInvalid      = 4 // invalid rules document or shedder settings; nothing was written
	ExitDenied       = 5 // permission denied by Consul ACLs
	ExitNotConverged = 6 // regions status: a healthy edge runs other rules than KV holds
	ExitUnreachable  = 7 // Consul agent unreachable (or timed out)
	ExitUnknown      = 8 // unknown region (no such Consul datacenter)
	ExitUnreadable   = 9 // a push some registered edge cannot read (a newer document schema); nothing was written
	// rules diff follows diff(1) and terraform plan -detailed-exitcode:
	// 0 same, 1 different, 2 and up trouble. Its errors keep the codes
	// above, except the general one, which is 10 there instead of 1.
	ExitDiffers   = 1  // rules diff: the rules differ
	ExitDiffError = 10 // rules diff: an error other commands exit 1 for
)

const usageText = `regionctl manages edgeguard rules, shedder settings, host tables and TLS certificates in Consul, region by region.

Usage:
  regionctl [global flags] <command> [flags] [args]

Rules (YAML, schema v1; each region is a Consul datacenter of the same name):
  rules validate FILE...                       check files offline, listing every problem as FILE:LINE
  rules test [--lint-errors] FILE...           run rule test files: requests with the rules, keys and decisions
                                               expected, through the edge's own code; exit 4 when a case fails
  rules diff --region R [--global] FILE        rule-level diff of R's region (or global) document against FILE
  rules diff OLD NEW                           rule-level diff of two files, offline
  rules push --region R [--global] FILE        write FILE as R's region (or global) document (check-and-set)
  rules push --all FILE                        write FILE as the global document into every region, one by one
  rules push --region R --canary POP --for DURATION FILE
                                               write FILE as R's region document for PoP POP's edges only, judge
                                               them against the rest of R on Prometheus, then promote FILE to R
                                               (exit 0) or roll it back (exit 11); see docs/regionctl.md
  rules push --region R --global --canary POP --for DURATION FILE
                                               the same for R's global document: PoP POP's edges run FILE in
                                               place of it, under R's region document
  rules push --all --canary R/POP --for DURATION FILE
                                               the global canary in R; promoted, FILE goes to every region as
                                               --all writes it; rolled back, to none
  rules get --region R [--effective|--global|--document]
                                               print the effective merged rules (default) or a stored document
  rules history --region R [--limit N] [--kind K]
                                               list pushes: seq, time, author, host, kind, version, message;
                                               then the history retention and what it pruned
  rules rollback --region R [--global] [--to VERSION]
                                               restore the previous (or the given) document from history

Shedder settings (JSON):
  shedder get --region R                       effective settings: stored JSON over the defaults
  shedder set --region R [--reset] key=value…  change settings (validated, check-and-set)
  shedder set --region R --canary POP --for DURATION key=value…
                                               the same settings at PoP POP's edges first, judged and promoted
                                               or rolled back (exit 11) as rules push --canary
  shedder simulate --region R --pop P --from T1 --to T2 [--prometheus URL] [key=value…]
                                               replay recorded utilization: current settings, then the candidate

Enforcement switch (JSON; region-wide, read by every edge of the region at once):
  enforcement get --region R                   the switch in force: enforce, shadow or enforce P%, and its version
  enforcement set --region R shadow            every rule of R counts and denies nothing
  enforcement set --region R enforce [--percent P]
                                               every rule denies, for all keys or for P % of each rule's keys
  enforcement rollback --region R [--to VERSION]
                                               restore the previous (or the given) switch from history

TLS certificates (chain and key, PEM; one key per certificate, served by the region's edges):
  certs put --region R NAME FILE               validate FILE and write it as certificate NAME
  certs list --region R                        names, DNS names, expiry; invalid ones flagged
  certs rm --region R NAME                     delete certificate NAME

Rate limit service (envoyproxy/ratelimit YAML, one domain per document; see docs/envoy.md):
  rls validate [--merge-domains] FILE|DIR...   check documents offline, alone and together, listing every
                                               problem as FILE:LINE; a DIR stands for its .yaml/.yml files
  rls diff [--merge-domains] OLD NEW           limit-level diff of two files or directories, offline
                                               (exit codes as rules diff)
  rls push (--region R | --all) [--merge-domains] FILE|DIR...
                                               write each FILE as rls/R/<base name> in one transaction
                                               (check-and-set, history); validated with R's other documents first;
                                               --all: every region, one by one, all checked first
  rls get --region R [NAME]                    print R's documents (or one) with key, ModifyIndex and version
  rls rm (--region R | --all) NAME...          remove documents (check-and-set, history); the rest validated first
  rls rollback --region R [--to VERSION] NAME  restore a document from history: the previous version (a removed
                                               one comes back), or the given version or history seq

Host table (YAML; which origin pool serves which hostname, see docs/hosts.md):
  hosts validate FILE...                       check tables offline, listing every problem as FILE:LINE
  hosts diff OLD NEW                           host- and pool-level diff of two files, offline
                                               (exit codes as rules diff)
  hosts diff --region R FILE                   the same against R's stored table
  hosts push --region R FILE                   write FILE as R's host table (validated, check-and-set, history)
  hosts push --region R --canary POP --for DURATION FILE
                                               FILE at PoP POP's edges first, judged and promoted or rolled back
                                               (exit 11) as rules push --canary
  hosts get --region R                         the stored table with its version and ModifyIndex
  hosts rollback --region R [--to VERSION]     restore the previous (or the given) table from history

Regions:
  regions status [--region R]                  per region and PoP: healthy edges and the rules each runs,
                                               flagging edges that have not converged
  catalog push FILE                            write the region catalog (JSON: each region's name and Redis,
                                               for scope: global rules) into every region it lists

Push flags (rules push, rules rollback, enforcement set, enforcement rollback,
hosts push, hosts rollback):
--dry-run shows what would change (rules added, removed, changed; versions; the
affected rules' requests/s by decision from --prometheus URL or $PROMETHEUS_URL)
and writes nothing; --expect-version V refuses (exit 3) unless the document in
force is version V, in the same check-and-set as the write; on a terminal the
push shows the change and asks, --yes skips the question (never asked without
a terminal). Also --message TEXT, --author NAME (default $USER), --keep-history N
(default 50: after the push, keep the newest N history entries of each document
in the region, delete older ones; 0 keeps all). A push (rls and shedder set too)
using a document field
some registered edge of the region cannot read (catalog meta schema_<kind>; an edge
without it reads schema 1) is refused (exit 9), naming the edges and the fields;
--force writes it anyway, after confirmation on a terminal. Every push checks the
document's ModifyIndex in the same Consul transaction that appends the history
entry (author, host, time, message), so a concurrent push fails with a conflict.
A push validates FILE and each region's resulting effective rules first and
writes nothing if any is invalid. --all writes the regions one by one.
A push (or rollback) that leaves a region with no rule at all is refused
(exit 4) unless --allow-empty: edges keep their rules when the documents are
absent, so an explicit empty document (rules: []) is how every rule is cleared.
A document over 192 KiB is stored in parts with a manifest (see docs/regionctl.md); parts
no manifest names any more are deleted by a push once the region's edges have
converged, and kept until then.
"rules get" and "regions status" show effective versions (what edges report);
"rules history" shows pushed document versions, which "rollback --to" takes.

Global flags (before or after the command):
  --consul ADDR      Consul HTTP address; https://host:8501 for TLS
                     (default $CONSUL_HTTP_ADDR, else 127.0.0.1:8500)
  --token TOKEN      ACL token (default $CONSUL_HTTP_TOKEN)
  --ca-file, --cert-file, --key-file
                     TLS files (default $CONSUL_CACERT, $CONSUL_CLIENT_CERT, $CONSUL_CLIENT_KEY)
  --prefix PREFIX    KV prefix (default edgeguard/)
  --output FORMAT    text or json (default text)
  --timeout DUR      bound on each Consul request (default 10s)

Exit codes:
  0  success ("rules diff", "hosts diff": the same)
  1  error ("rules diff", "hosts diff": they differ)
  2  usage error
  3  conflict: the document changed since it was read (another push won); re-run
  4  invalid rules document, shedder settings or host table, or a failing rule test
     (rules test, validate --tests, push --tests); nothing was written
  5  permission denied by Consul ACLs
  6  not converged (regions status): a healthy edge runs other rules than KV holds
  7  Consul unreachable: the agent, or through it a region's servers
  8  unknown region
  9  refused: some registered edge of the region cannot read the document (it uses a field
     of a newer document schema than the edge reads); nothing was written (--force overrides)
  10 rules diff, rls diff and hosts diff: any other error (other commands exit 1 for it),
     so that they exit 0 same, 1 different, 2 and up trouble, like diff(1)
  11 rules push, shedder set and hosts push --canary: the canary was judged bad (or its PoP did not load it) and rolled back;
     the region keeps its document (rules push --all --canary: no region is written)
A multi-region command (push --all, status) whose regions failed for one reason
exits with that reason's code, with 1 when reasons differ.
`

// Main runs regionctl with args (without the program name), reading the
// environment through env, and returns the exit code.
func Main(args []string, env func(string) string, stdout, stderr io.Writer) int {
	a := &app{stdin: os.Stdin, isTerminal: func() bool { return term.IsTerminal(int(os.Stdin.Fd())) }}
	return a.run(args, env, stdout, stderr)
}

// app is one run of the program. Tests set its hooks.
type app struct {
	// beforeWrite, when set, runs after a region's documents were read and
	// before they are written (tests use it to line up concurrent pushes).
	beforeWrite func(region string)
	// onPart, when set, runs before each part of a document stored in
	// parts is written; an error interrupts the push there.
	onPart func(region string, i, n int) error
	parsed map[[sha256.Size]byte]parsedDoc // parseRules' results
	// stdin answers the confirmation a push asks for when isTerminal
	// says stdin is a terminal (nil: never).
	stdin      io.Reader
	isTerminal func() bool
	// schemas are the document schemas pushes are checked against (nil:
	// region.DocumentSchemas).
	schemas region.Schemas
	force   bool  // --force: write documents some edges cannot read
	yes     *bool // the command's --yes

	g        globals
	usage    bytes.Buffer // a command's usage text, as the flag package printed it
	usageDue bool         // a bad command line: print usage to stderr
	env      func(string) string
	stdout   *countingWriter
	stderr   io.Writer
}

// globals are the flags every command accepts.
type globals struct {
	consul, token             string
	caFile, certFile, keyFile string
	prefix, output            string
	timeout                   time.Duration
	defaultsFilled            bool
}

func (g *globals) fill(env func(string) string) {
	if g.defaultsFilled {
		return
	}
	g.defaultsFilled = true
	g.consul = env("CONSUL_HTTP_ADDR")
	if g.consul == "" {
		g.consul = "127.0.0.1:8500"
	}
	if !strings.Contains(g.consul, "://") && isTrue(env("CONSUL_HTTP_SSL")) {
		g.consul = "https://" + g.consul
	}
	g.token = env("CONSUL_HTTP_TOKEN")
	g.caFile = env("CONSUL_CACERT")
	g.certFile = env("CONSUL_CLIENT_CERT")
	g.keyFile = env("CONSUL_CLIENT_KEY")
	g.prefix = region.DefaultPrefix
	g.output = "text"
	g.timeout = 10 * time.Second
}

func isTrue(s string) bool {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// register adds the global flags to fs, with their current values as
// defaults, so they work before and after the command name.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.consul, "consul", g.consul, "Consul HTTP `address` (https://host:8501 for TLS)")
	fs.StringVar(&g.token, "token", g.token, "Consul ACL `token`")
	fs.StringVar(&g.caFile, "ca-file", g.caFile, "CA certificate `file` for TLS")
	fs.StringVar(&g.certFile, "cert-file", g.certFile, "client certificate `file` for TLS")
	fs.StringVar(&g.keyFile, "key-file", g.keyFile, "client key `file` for TLS")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "Consul KV `prefix`")
	fs.StringVar(&g.output, "output", g.output, "output `format`: text or json")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "bound on each Consul request")
}

func (a *app) run(args []string, env func(string) string, stdout, stderr io.Writer) int {
	if env == nil {
		env = os.Getenv
	}
	a.env, a.stdout, a.stderr = env, &countingWriter{w: stdout}, stderr
	a.g.fill(env)

	err := a.dispatch(args)
	code := exitCode(err)
	if code == ExitUsage && a.g.output != "json" && wantsJSON(args) {
		// The bad flag stopped parsing before --output json was reached.
		a.g.output = "json"
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		msg := a.message(err)
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, "regionctl: "+msg)
		}
		if a.usageDue {
			// The synopsis only: the flags are one --help away, and the
			// error line must not scroll out of sight under them.
			synopsis, _, _ := bytes.Cut(a.usage.Bytes(), []byte("\n"))
			fmt.Fprintf(stderr, "%s\n", synopsis)
		}
		if a.g.output == "json" && a.stdout.n == 0 {
			a.emitJSON(map[string]any{"error": msg, "exit_code": code, "reason": reasonOf(code)})
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		code = ExitOK
	}
	return code
}

// wantsJSON reports whether the last --output on the command line asks for
// JSON, for a usage error that stopped parsing before it.
func wantsJSON(args []string) bool {
	out := ""
	for i, arg := range args {
		if arg == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != "output" {
			continue
		}
		switch {
		case hasValue:
			out = value
		case i+1 < len(args):
			out = args[i+1]
		}
	}
	return out == "json"
}

// commands are the leaves of the command tree; each prints its own usage
// with --help.
var commands = map[string]func(a *app, args []string) error{
	"rules validate": (*app).rulesValidate,
	"rules diff":     (*app).rulesDiffCoded,
	"rules push":     (*app).rulesPush,
	"rules get":      (*app).rulesGet,
	"rules history":  (*app).rulesHistory,
	"rules rollback": (*app).rulesRollback,
	"shedder get":    (*app).shedderGet,
	"shedder set":    (*app).shedderSet,
	"regions status": (*app).regionsStatus,
	"certs put":      (*app).certsPut,
	"certs list":     (*app).certsList,
	"certs rm":       (*app).certsRm,
	"rls validate":   (*app).rlsValidate,
	"rls diff":       (*app).rlsDiff,
	"rls push":       (*app).rlsPush,
	"rls rm":         (*app).rlsRm,
	"rls rollback":   (*app).rlsRollback,
	"rls get":        (*app).rlsGet,
	"hosts validate": (*app).hostsValidate,
	"hosts diff":     (*app).hostsDiffCoded,
	"hosts push":     (*app).hostsPush,
	"hosts get":      (*app).hostsGet,
	"hosts rollback": (*app).hostsRollback,

	// Global rules' region catalog.
	"catalog push": (*app).catalogPush,
}

func (a *app) dispatch(args []string) error {
	top := flag.NewFlagSet("regionctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	a.g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(a.stdout, usageText)
			return err
		}
		return usagef("%v (see regionctl --help)", err)
	}
	rest := top.Args()
	if len(rest) == 0 {
		fmt.Fprint(a.stderr, usageText)
		return errReportedUsage
	}
	if rest[0] == "help" {
		fmt.Fprint(a.stdout, usageText)
		return nil
	}
	if len(rest) == 1 {
		return usagef("%q needs a subcommand (see regionctl --help)", rest[0])
	}
	name := rest[0] + " " + rest[1]
	if run, ok := commands[name]; ok {
		return run(a, rest[2:])
	}
	return usagef("unknown command %q (see regionctl --help)", name)
}

// flags returns a flag set for a command, with the global flags on it. The
// flag package prints the usage on --help and on a bad command line; it goes
// to a buffer, which parse sends to stdout for --help and to stderr for an
// error, so that stdout holds only the JSON error under --output json.
func (a *app) flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("regionctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.g.register(fs)
	fs.Usage = func() {
		a.usage.Reset()
		fmt.Fprintf(&a.usage, "Usage: regionctl %s %s\n\nFlags:\n", name, synopsis)
		flaghelp.Print(&a.usage, fs, nil)
		fmt.Fprint(&a.usage, "\nSee regionctl --help for the exit codes.\n")
	}
	return fs
}

// regionVar is the --region flag of the commands that act on one region.
func regionVar(fs *flag.FlagSet, r *string) {
	fs.StringVar(r, "region", "", "region (Consul datacenter) `name`")
}

// parse parses flags interspersed with positional arguments and checks the
// global flags' values.
func (a *app) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				_, _ = a.stdout.Write(a.usage.Bytes())
				return nil, err
			}
			a.usageDue = true // printed after the error line
			return nil, usagef("%s: %v (see %s --help)", fs.Name(), err, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	switch a.g.output {
	case "text", "json":
	default:
		out := a.g.output
		a.g.output = "text"
		return nil, usagef("--output must be text or json, got %q", out)
	}
	if a.g.timeout <= 0 {
		return nil, usagef("--timeout must be > 0, got %s", a.g.timeout)
	}
	return pos, nil
}

func (a *app) json() bool { return a.g.output == "json" }

func (a *app) emitJSON(v any) {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (a *app) printf(format string, args ...any) { fmt.Fprintf(a.stdout, format, args...) }

// countingWriter tells whether anything was printed to stdout.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}
