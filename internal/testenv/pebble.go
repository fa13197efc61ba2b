package testenv

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// pebbleVersion is the build scripts/install-pebble.sh caches.
const pebbleVersion = "v2.10.1"

// Pebble is Let's Encrypt's ACME test server, with its challenge test
// server as the DNS it resolves names with (every name is 127.0.0.1), so
// an edge on loopback can be issued certificates for any name. It is
// stopped when the test ends.
type Pebble struct {
	// DirectoryURL is the ACME directory (https://localhost:PORT/dir).
	DirectoryURL string
	// RootFile is a PEM file of the root the directory's HTTPS chains to.
	RootFile string
}

// PebbleOptions configure a Pebble.
type PebbleOptions struct {
	// TLSALPNPort is where Pebble validates TLS-ALPN-01 challenges (the
	// edge's TLS port).
	TLSALPNPort int
	// Validity is how long its certificates are valid (default 90 days).
	Validity time.Duration
}

// StartPebble starts Pebble and its DNS, built by scripts/install-pebble.sh
// (or found in $EDGEGUARD_PEBBLE, a directory holding both binaries).
func StartPebble(t testing.TB, opts PebbleOptions) *Pebble {
	t.Helper()
	dir := os.Getenv("EDGEGUARD_PEBBLE")
	if dir == "" {
		cache := os.Getenv("EDGEGUARD_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			require.NoError(t, err)
			cache = filepath.Join(home, ".cache", "edgeguard")
		}
		dir = filepath.Join(cache, "pebble-"+pebbleVersion)
	}
	pebble, challtest := filepath.Join(dir, "pebble"), filepath.Join(dir, "pebble-challtestsrv")
	for _, b := range []string{pebble, challtest} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("testenv: %s not found: run scripts/install-pebble.sh (make tools) or set EDGEGUARD_PEBBLE", b)
		}
	}
	work := t.TempDir()
	// The directory's own HTTPS certificate.
	ca := NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "localhost")
	rootFile := filepath.Join(work, "root.pem")
	require.NoError(t, os.WriteFile(rootFile, ca.PEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "cert.pem"), leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "key.pem"), leaf.KeyPEM, 0o600))
	// Picking free ports and binding them later races with every other
	// process on the host: a bind failure is retried with fresh ports.
	for attempt := 1; ; attempt++ {
		p, busy := startPebbleOn(t, work, pebble, challtest, opts, ca)
		if p != nil {
			p.RootFile = rootFile
			return p
		}
		if !busy || attempt == bindAttempts {
			t.Fatalf("testenv: pebble did not start (attempt %d; logs above)", attempt)
		}
	}
}

// startPebbleOn starts Pebble and its DNS on fresh ports and waits until
// both answer. It returns nil when they did not, with busy set when one
// exited because another process had taken its port.
func startPebbleOn(t testing.TB, work, pebble, challtest string, opts PebbleOptions, ca *CA) (p *Pebble, busy bool) {
	t.Helper()
	ports, err := FreePorts(4)
	require.NoError(t, err)
	acmePort, mgmtPort, dnsPort, chalMgmtPort := ports[0], ports[1], ports[2], ports[3]
	validity := opts.Validity
	if validity == 0 {
		validity = 90 * 24 * time.Hour
	}
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  "127.0.0.1:" + strconv.Itoa(acmePort),
		"managementListenAddress":        "127.0.0.1:" + strconv.Itoa(mgmtPort),
		"certificate":                    filepath.Join(work, "cert.pem"),
		"privateKey":                     filepath.Join(work, "key.pem"),
		"httpPort":                       0,
		"tlsPort":                        opts.TLSALPNPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm":                   "ecdsa",
		"profiles":                       map[string]any{"default": map[string]any{"description": "test", "validityPeriod": int(validity.Seconds())}},
	}}
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	cfgFile := filepath.Join(work, fmt.Sprintf("pebble-%d.json", acmePort))
	require.NoError(t, os.WriteFile(cfgFile, data, 0o600))

	type started struct {
		proc *Proc
		log  string
	}
	var procs []started
	start := func(cmd *exec.Cmd, name string) {
		log, err := os.Create(filepath.Join(work, fmt.Sprintf("%s-%d.log", name, acmePort)))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, work
		pr, err := proc.Start(cmd)
		require.NoError(t, err)
		procs = append(procs, started{pr, log.Name()})
		t.Cleanup(func() {
			pr.Stop(5 * time.Second)
			_ = log.Close()
			if t.Failed() {
				out, _ := os.ReadFile(log.Name())
				t.Logf("%s log:\n%s", name, out)
			}
		})
	}
	start(exec.Command(challtest, "-dnsserver", "127.0.0.1:"+strconv.Itoa(dnsPort), "-management", "127.0.0.1:"+strconv.Itoa(chalMgmtPort),
		"-http01", "", "-https01", "", "-doh", "", "-tlsalpn01", "", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""), "challtestsrv")
	cmd := exec.Command(pebble, "-config", cfgFile, "-dnsserver", "127.0.0.1:"+strconv.Itoa(dnsPort))
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	start(cmd, "pebble")

	// Ready once both answer; over as soon as one of them has exited.
	p = &Pebble{DirectoryURL: fmt.Sprintf("https://localhost:%d/dir", acmePort)}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	defer client.CloseIdleConnections()
	exited := false
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = proc.Poll(ctx, "pebble to answer", func(context.Context) error {
		for _, s := range procs {
			if !s.proc.Alive() {
				exited = true
				return proc.Permanent(errors.New("exited"))
			}
		}
		if !pebbleAnswers(client, chalMgmtPort, p.DirectoryURL) {
			return errors.New("not answering")
		}
		return nil
	})
	if err == nil {
		return p, false
	}
	for _, s := range procs {
		s.proc.Stop(5 * time.Second)
		out, _ := os.ReadFile(s.log)
		busy = busy || strings.Contains(strings.ToLower(string(out)), "address already in use")
	}
	return nil, exited && busy
}

// pebbleAnswers reports whether the challenge server's management port
// accepts and the ACME directory answers 200.
func pebbleAnswers(client *http.Client, chalMgmtPort int, directory string) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(chalMgmtPort), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	resp, err := client.Get(directory)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
