package testenv

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	ports, err := FreePorts(4)
	require.NoError(t, err)
	acmePort, mgmtPort, dnsPort, chalMgmtPort := ports[0], ports[1], ports[2], ports[3]
	work := t.TempDir()

	// The directory's own HTTPS certificate.
	ca := NewCA(t)
	leaf := ca.Issue(t, "ecdsa", "localhost")
	p := &Pebble{DirectoryURL: fmt.Sprintf("https://localhost:%d/dir", acmePort), RootFile: filepath.Join(work, "root.pem")}
	require.NoError(t, os.WriteFile(p.RootFile, ca.PEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "cert.pem"), leaf.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "key.pem"), leaf.KeyPEM, 0o600))
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
	cfgFile := filepath.Join(work, "pebble.json")
	require.NoError(t, os.WriteFile(cfgFile, data, 0o600))

	start := func(cmd *exec.Cmd, name string) {
		log, err := os.Create(filepath.Join(work, name+".log"))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, work
		proc, err := StartProc(cmd)
		require.NoError(t, err)
		t.Cleanup(func() {
			proc.Stop(5 * time.Second)
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

	// Ready once both answer.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	defer client.CloseIdleConnections()
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(chalMgmtPort), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		resp, err := client.Get(p.DirectoryURL)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond, "pebble did not answer")
	return p
}
