// Package check is `edge check`: every file and setting an edge would read,
// validated offline.
package check

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Run is `edge check [flags]`: it validates offline, without binding a
// port or contacting Redis or Consul, everything the flags name — the
// settings (command line, environment, --config), the --rules file
// against them, the --shedder file, the --hosts table, the
// --rls-config-dir documents, the certificates of --tls-cert-dir,
// --tls-default-cert and --rls-tls-cert, the --tls-ticket-keys and
// --origin-ca-file files, the --access-log file, the --redis URL — and prints every problem in one pass: whatever
// the edge would refuse at start, short of what needs the network
// (binding a port, Redis, Consul).
// It returns the exit code: 0 all valid, 1 problems found, 2 usage.
func Run(args, environ []string, stdout, stderr io.Writer) int {
	var usage bytes.Buffer
	cfg, err := config.ParseArgs(args, environ, &usage)
	if code, done := config.CommandLineError(err, "edge check", &usage, stdout, stderr); done {
		return code
	}
	var problems []error
	// Settings problems (an origin missing, a bad duration) are problems
	// to report, not a reason to stop: the files are still checked.
	if err != nil {
		problems = append(problems, fmt.Errorf("settings: %w", err))
	}
	if cfg.Rules != "" {
		problems = append(problems, checkRules(cfg))
	}
	if cfg.Shedder != "" {
		data, err := os.ReadFile(cfg.Shedder)
		var scfg shedder.Config
		if err == nil {
			scfg, err = shedder.ParseConfig(data)
		}
		if err == nil {
			// What Shedder.Update builds besides validating.
			_, err = shedder.NewClassifier(scfg.Tiers)
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("shedder %s: %w", cfg.Shedder, err))
		}
	}
	if cfg.TLSCertDir != "" || cfg.TLSDefaultCert != "" {
		problems = append(problems, checkCerts(cfg))
	}
	if cfg.TLSTicketKeys != "" {
		if err := listen.CheckTicketKeys(cfg.TLSTicketKeys); err != nil {
			problems = append(problems, fmt.Errorf("tls-ticket-keys %s: %w", cfg.TLSTicketKeys, err))
		}
	}
	if f := cfg.OriginCAFile; f != "" {
		// As the edge reads it when it builds the origin pool.
		pem, err := os.ReadFile(f)
		if err == nil && !x509.NewCertPool().AppendCertsFromPEM(pem) {
			err = errors.New("no PEM certificate")
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("origin-ca-file %s: %w", f, err))
		}
	}
	if cfg.RLS.TLSCert != "" && cfg.RLS.TLSKey != "" {
		// The same reading and chain validation the rate limit service's
		// listener does at start (certstore.Validate).
		if _, err := rls.TLSConfig(cfg.RLS.TLSCert, cfg.RLS.TLSKey, cfg.RLS.ClientCA); err != nil {
			problems = append(problems, fmt.Errorf("rls-tls-cert %s: %w", cfg.RLS.TLSCert, err))
		}
	}
	if cfg.Redis != "" {
		// The client the edge builds before it dials anything: the URL
		// and its options, for the mode.
		if c, err := limiter.NewRedisClient(cfg.Redis, cfg.RedisMode); err != nil {
			problems = append(problems, fmt.Errorf("redis: %w", err))
		} else {
			_ = c.Close() // never connected
		}
	}
	if cfg.AccessLog != "" && cfg.AccessLog != "-" {
		if err := checkAccessLog(cfg.AccessLog); err != nil {
			problems = append(problems, fmt.Errorf("access-log %s: %w", cfg.AccessLog, err))
		}
	}
	hostsChecked := ""
	if cfg.Hosts != "" {
		// Problems as FILE:LINE, as regionctl hosts validate gives them.
		if t, err := hosts.ParseFile(cfg.Hosts); err != nil {
			problems = append(problems, err)
		} else {
			hostsChecked = fmt.Sprintf(" hosts %s (hosts %d, pools %d)", cfg.Hosts, len(t.Hosts), len(t.Pools))
		}
	}
	rlsChecked := ""
	if cfg.RLS.ConfigDir != "" {
		c, err := rlsconfig.LoadDir(cfg.RLS.ConfigDir, cfg.RLS.MergeDomains, cfg.RLS.Match()...)
		if err != nil {
			problems = append(problems, fmt.Errorf("rls-config-dir %s: %w", cfg.RLS.ConfigDir, err))
		} else {
			rlsChecked = fmt.Sprintf(" rls %s (domains %d, limits %d)", cfg.RLS.ConfigDir, len(c.Domains()), len(c.Limits()))
		}
	}
	if err := errors.Join(problems...); err != nil {
		fmt.Fprintln(stdout, err)
		return 1
	}
	fmt.Fprintln(stdout, "ok: settings", nameOr(cfg.ConfigFile, "(flags and environment)"), "rules", nameOr(cfg.Rules, "(none)"), "shedder", nameOr(cfg.Shedder, "(defaults)")+hostsChecked+rlsChecked)
	return 0
}

// checkCerts reads --tls-cert-dir and --tls-default-cert as the edge
// would (certstore: the one validation the edge, Consul's certificates
// and regionctl certs put share), and lists every certificate refused.
// Without --consul (whose certificates come later), a TLS listener with
// no valid certificate at all is refused too, as the edge refuses it.
func checkCerts(cfg config.Config) error {
	store := certstore.New(cfg.TLSCertDir, cfg.TLSDefaultCert)
	rep, err := store.Scan()
	if err != nil {
		return fmt.Errorf("tls-cert-dir %s: %w", cfg.TLSCertDir, err)
	}
	var errs []error
	for _, r := range rep.Refused {
		errs = append(errs, fmt.Errorf("certificate %s: %w", r.Source, r.Err))
	}
	if cfg.ListenTLS != "" && cfg.Consul == "" && store.Len() == 0 {
		errs = append(errs, errors.New("listen-tls: no valid certificate in --tls-cert-dir or --tls-default-cert"))
	}
	return errors.Join(errs...)
}

// checkAccessLog says whether the edge could open path as it does at start
// (append, created when missing) without creating or writing it: an
// existing file is opened for appending and closed, a missing one needs
// a directory the edge may write in.
func checkAccessLog(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		return f.Close()
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir := filepath.Dir(path)
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("cannot create it in %s: %w", dir, err)
	}
	return nil
}

func checkRules(cfg config.Config) error {
	data, err := os.ReadFile(cfg.Rules)
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	snap, err := rules.Load(data, cfg.CompileOptions()...)
	if err != nil {
		return located(cfg.Rules, err)
	}
	if err := cfg.CheckRules(snap); err != nil {
		return fmt.Errorf("rules %s: %w", cfg.Rules, err)
	}
	return nil
}

// located is the problems of the rules file in err, one per line as pkg/rules
// words them after the file ("FILE:LINE: rule "ID": FIELD: message"), as
// "regionctl rules validate" prints them.
func located(file string, err error) error {
	fes := rules.FieldErrors(err)
	if len(fes) == 0 {
		return fmt.Errorf("rules %s: %w", file, err)
	}
	errs := make([]error, len(fes))
	for i, fe := range fes {
		errs[i] = locatedError{file, fe}
	}
	return errors.Join(errs...)
}

type locatedError struct {
	file string
	fe   *rules.FieldError
}

func (e locatedError) Error() string { return e.fe.Located(e.file) }
func (e locatedError) Unwrap() error { return e.fe }

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
