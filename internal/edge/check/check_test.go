package check_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge"
	"github.com/edgeguard/edgeguard/internal/edge/check"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// files is a set of valid inputs for every file the edge reads at start;
// each case of TestCheckRefusesWhatTheEdgeRefuses breaks one of them.
type files struct {
	dir                                         string
	certDir, defaultCert, ticketKeys, originCA  string
	rules, shedder, hosts, rlsDir, rlsCert, key string
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	return path
}

func newFiles(t *testing.T) files {
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "a.example")
	f := files{dir: dir, certDir: filepath.Join(dir, "certs"), rlsDir: filepath.Join(dir, "rls")}
	require.NoError(t, os.Mkdir(f.certDir, 0o700))
	require.NoError(t, os.Mkdir(f.rlsDir, 0o700))
	writeFile(t, filepath.Join(f.certDir, "a.example.pem"), string(leaf.Bundle()))
	f.defaultCert = writeFile(t, filepath.Join(dir, "default.pem"), string(leaf.Bundle()))
	f.ticketKeys = writeFile(t, filepath.Join(dir, "tickets"), "# current first\n"+strings.Repeat("ab", 32)+"\n")
	f.originCA = writeFile(t, filepath.Join(dir, "origin-ca.pem"), string(ca.PEM))
	f.rules = writeFile(t, filepath.Join(dir, "rules.yaml"), "version: 1\nrules: []\n")
	f.shedder = writeFile(t, filepath.Join(dir, "shedder.yaml"), "{}\n")
	f.hosts = writeFile(t, filepath.Join(dir, "hosts.yaml"), "version: 1\nhosts:\n  a.example: {pool: default}\n")
	writeFile(t, filepath.Join(f.rlsDir, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	f.rlsCert = writeFile(t, filepath.Join(dir, "rls.pem"), string(leaf.CertPEM))
	f.key = writeFile(t, filepath.Join(dir, "rls.key"), string(leaf.KeyPEM))
	return f
}

// args is a command line that reads every one of f's files; loopback
// ports the system picks, and no network dependency (no --redis, no
// --consul: what needs them is out of an offline check's reach).
func (f files) args() []string {
	return []string{
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0",
		"--origin", "https://127.0.0.1:9", "--origin-ca-file", f.originCA,
		"--listen-tls", "127.0.0.1:0", "--tls-cert-dir", f.certDir, "--tls-default-cert", f.defaultCert, "--tls-ticket-keys", f.ticketKeys,
		"--rules", f.rules, "--shedder", f.shedder, "--hosts", f.hosts, "--access-log", filepath.Join(f.dir, "access.log"),
		"--rls-listen", "127.0.0.1:0", "--rls-config-dir", f.rlsDir, "--rls-tls-cert", f.rlsCert, "--rls-tls-key", f.key,
	}
}

// set returns args with flag's value replaced (or the flag added).
func set(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// drop returns args without flag and its value.
func drop(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// start runs the edge's own start path (cmd/edge: the command line, then
// edge.New) and returns why it refused to start, or "" when it started
// (it is stopped again at once).
func start(t *testing.T, args, environ []string) string {
	t.Helper()
	var stderr bytes.Buffer
	cfg, _, ok := config.ParseCommandLine(args, environ, io.Discard, &stderr)
	if !ok {
		return strings.TrimSpace(stderr.String())
	}
	e, err := edge.New(cfg, config.NewLogger(io.Discard, "error"))
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, e.Run(ctx)) // stops at once: the context is done
	return ""
}

func runCheck(args, environ []string) (int, string) {
	var out bytes.Buffer
	code := check.Run(args, environ, &out, &out)
	return code, out.String()
}

// TestCheckRefusesWhatTheEdgeRefuses holds `edge check` to the edge: each
// case is an input the edge refuses to start on (asserted by running the
// edge's start path) and that edge check must refuse too (exit 1), naming
// the problem. The valid inputs the cases break start an edge and pass
// the check, so each refusal is the one thing the case broke.
func TestCheckRefusesWhatTheEdgeRefuses(t *testing.T) {
	f := newFiles(t)
	valid := f.args()
	t.Run("valid", func(t *testing.T) {
		require.Empty(t, start(t, valid, nil))
		code, out := runCheck(valid, nil)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "ok: ")
	})

	garbage := writeFile(t, filepath.Join(f.dir, "garbage"), "garbage\n")
	onlyGarbage := filepath.Join(f.dir, "only-garbage")
	require.NoError(t, os.Mkdir(onlyGarbage, 0o700))
	writeFile(t, filepath.Join(onlyGarbage, "b.example.pem"), "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
	empty := filepath.Join(f.dir, "empty")
	require.NoError(t, os.Mkdir(empty, 0o700))
	missing := filepath.Join(f.dir, "missing")
	shortKey := writeFile(t, filepath.Join(f.dir, "short-tickets"), "abcd\n")

	noDefault := drop(valid, "--tls-default-cert")
	salt := []string{"EDGEGUARD_KEY_SALT=0123456789abcdef0123"}
	cases := []struct {
		name    string
		args    []string
		env     []string
		problem string // what edge check's output must name
	}{
		{"tls-cert-dir missing", set(valid, "--tls-cert-dir", missing), nil, "tls-cert-dir " + missing},
		{"tls-cert-dir only garbage", set(noDefault, "--tls-cert-dir", onlyGarbage), nil, "no valid certificate"},
		{"tls-cert-dir empty", set(noDefault, "--tls-cert-dir", empty), nil, "no valid certificate"},
		{"tls-default-cert missing", set(drop(valid, "--tls-cert-dir"), "--tls-default-cert", missing), nil, "certificate " + missing},
		{"tls-default-cert garbage", set(drop(valid, "--tls-cert-dir"), "--tls-default-cert", garbage), nil, "no valid certificate"},
		{"tls-ticket-keys missing", set(valid, "--tls-ticket-keys", missing), nil, "tls-ticket-keys " + missing},
		{"tls-ticket-keys garbage", set(valid, "--tls-ticket-keys", garbage), nil, "tls-ticket-keys " + garbage + ": line 1"},
		{"tls-ticket-keys short key", set(valid, "--tls-ticket-keys", shortKey), nil, "64 hex digits"},
		{"tls files without listen-tls", drop(valid, "--listen-tls"), nil, "given without --listen-tls"},
		{"origin-ca-file missing", set(valid, "--origin-ca-file", missing), nil, "origin-ca-file " + missing},
		{"origin-ca-file not PEM", set(valid, "--origin-ca-file", garbage), nil, "origin-ca-file " + garbage + ": no PEM certificate"},
		{"rules missing", set(valid, "--rules", missing), nil, "rules: open " + missing},
		{"rules garbage", set(valid, "--rules", garbage), nil, garbage + ":1: the top level"},
		{"shedder missing", set(valid, "--shedder", missing), nil, "shedder " + missing},
		{"shedder unknown field", set(valid, "--shedder", writeFile(t, filepath.Join(f.dir, "shedder-bad.yaml"), "enabeld: true\n")), nil, "enabeld"},
		{"hosts missing", set(valid, "--hosts", missing), nil, "reading host table"},
		{"hosts garbage", set(valid, "--hosts", garbage), nil, garbage + ":"},
		{"rls-config-dir missing", set(valid, "--rls-config-dir", missing), nil, "rls-config-dir " + missing},
		{"rls-config-dir bad document", set(valid, "--rls-config-dir", func() string {
			d := filepath.Join(f.dir, "rls-bad")
			require.NoError(t, os.Mkdir(d, 0o700))
			writeFile(t, filepath.Join(d, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n")
			return d
		}()), nil, "fortnight"},
		{"rls-tls-cert garbage", set(valid, "--rls-tls-cert", garbage), nil, "rls-tls-cert " + garbage},
		{"rls-tls-key missing", set(valid, "--rls-tls-key", missing), nil, "rls-tls-cert " + f.rlsCert},
		{"access-log directory missing", set(valid, "--access-log", filepath.Join(missing, "access.log")), nil, "access-log " + filepath.Join(missing, "access.log")},
		{"access-log is a directory", set(valid, "--access-log", empty), nil, "access-log " + empty},
		{"rls-client-ca garbage", set(valid, "--rls-client-ca", garbage), nil, "no certificate in " + garbage},
		{"redis URL no URL", set(valid, "--redis", "notaurl"), salt, "redis: parsing redis URL"},
		{"redis URL unknown option", set(valid, "--redis", "redis://127.0.0.1:9/?bogus=1"), salt, "unexpected option: bogus"},
		{"environment misspelled", valid, []string{"EDGEGUARD_LISTN=127.0.0.1:0"}, "EDGEGUARD_LISTN: no such setting"},
		{"environment bad value", valid, []string{"EDGEGUARD_WORKERS=many"}, "EDGEGUARD_WORKERS"},
		{"config file missing", set(valid, "--config", missing), nil, missing},
		{"key salt file missing", set(valid, "--key-salt-file", missing), nil, "key-salt-file: open " + missing},
		{"key salt too short", valid, []string{"EDGEGUARD_KEY_SALT=short"}, "key-salt: must be at least"},
		{"key salt twice", set(valid, "--key-salt-file", f.rules), []string{"EDGEGUARD_KEY_SALT=0123456789abcdef0123"}, "exclusive"},
		{"flag value refused", set(valid, "--drain-delay", "-1s"), nil, "drain-delay"},
		{"key salt required with redis", set(valid, "--redis", "redis://127.0.0.1:9"), nil, "key-salt: required with --redis"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			refused := start(t, c.args, c.env)
			require.NotEmpty(t, refused, "the edge started: this case is no start-time refusal")
			code, out := runCheck(c.args, c.env)
			require.Equal(t, 1, code, "edge check passed what the edge refuses (%s):\n%s", refused, out)
			require.Contains(t, out, c.problem, "the edge refused with: %s", refused)
		})
	}
}

// TestCheckReportsEveryProblem: several problems at once are all named in
// one pass, not just the first.
func TestCheckReportsEveryProblem(t *testing.T) {
	f := newFiles(t)
	missing := filepath.Join(f.dir, "missing")
	garbage := writeFile(t, filepath.Join(f.dir, "garbage"), "garbage\n")
	args := set(set(set(set(set(drop(f.args(), "--tls-default-cert"),
		"--tls-cert-dir", missing),
		"--tls-ticket-keys", garbage),
		"--rules", missing),
		"--shedder", garbage),
		"--origin-ca-file", garbage)
	env := []string{"EDGEGUARD_LISTN=127.0.0.1:0"}
	require.NotEmpty(t, start(t, args, env))
	code, out := runCheck(args, env)
	require.Equal(t, 1, code, out)
	for _, p := range []string{
		"EDGEGUARD_LISTN: no such setting",
		"tls-cert-dir " + missing,
		"tls-ticket-keys " + garbage,
		"rules: open " + missing,
		"shedder " + garbage,
		"origin-ca-file " + garbage,
	} {
		require.Contains(t, out, p)
	}
}
