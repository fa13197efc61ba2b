package edge

import (
	"context"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// h2specSummary is h2spec's last line: "146 tests, 146 passed, 0 skipped, 0 failed".
var h2specSummary = regexp.MustCompile(`(?m)^(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed$`)

// HTTP/2 conformance: h2spec, strict, over TLS, against the edge's TLS
// listener; every case passes.
func TestH2Spec(t *testing.T) {
	waiting(t)
	bin := testenv.H2spec(t)
	site := newTLSSite(t)
	site.put(t, "localhost.pem", "ecdsa", "localhost") // h2spec's SNI is its --host
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	_, port, err := net.SplitHostPort(r.TLSAddr())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-t", "-k", "-S", "-h", "localhost", "-p", port, "-o", "10").CombinedOutput()
	m := h2specSummary.FindSubmatch(out)
	require.NotNil(t, m, "no summary from h2spec (%v):\n%s", err, out)
	t.Logf("h2spec: %s", m[0])
	total, _ := strconv.Atoi(string(m[1]))
	passed, _ := strconv.Atoi(string(m[2]))
	require.Equal(t, 146, total, "h2spec %s runs 146 cases in strict mode", testenv.H2specVersion)
	require.Equal(t, total, passed, "h2spec:\n%s", out)
	require.NoError(t, err, "%s", out)
}
