package regionctl

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// Two federated regions (eu-west, us-east) and, apart, one agent with ACLs.
var (
	euWest, usEast, aclAgent *testenv.Consul
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	type started struct {
		c   *testenv.Consul
		err error
	}
	start := func(opts testenv.ConsulOptions) <-chan started {
		ch := make(chan started, 1)
		go func() {
			c, err := testenv.StartConsul(opts)
			ch <- started{c, err}
		}()
		return ch
	}
	eu, us, acl := start(testenv.ConsulOptions{Datacenter: "eu-west"}),
		start(testenv.ConsulOptions{Datacenter: "us-east"}),
		start(testenv.ConsulOptions{Datacenter: "ap-south", ACL: true})
	var failed bool
	for _, s := range []struct {
		ch  <-chan started
		dst **testenv.Consul
	}{{eu, &euWest}, {us, &usEast}, {acl, &aclAgent}} {
		r := <-s.ch
		if r.err != nil {
			log.Print(r.err)
			failed = true
			continue
		}
		*s.dst = r.c
		defer r.c.Close()
	}
	if failed {
		return 1
	}
	if err := euWest.JoinWAN(usEast); err != nil {
		log.Print(err)
		return 1
	}
	return m.Run()
}

// result is one in-process run of regionctl.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// testEnv is the environment regionctl sees in tests: CONSUL_HTTP_ADDR points
// at eu-west, whose agent forwards to us-east over the WAN.
func testEnv(extra ...string) func(string) string {
	m := map[string]string{"CONSUL_HTTP_ADDR": euWest.HTTPAddr(), "USER": "tester"}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return func(k string) string { return m[k] }
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	return runApp(t, &app{}, testEnv(), args...)
}

func runApp(t *testing.T, a *app, env func(string) string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := a.run(args, env, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// prefix is a KV prefix of the test's own, so tests run in parallel.
func prefix(t *testing.T) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")
	return "t/" + strings.ToLower(name) + "-" + hex.EncodeToString(b[:]) + "/"
}

// file writes a rules (or any) file into the test's temp dir.
func file(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// kv reads a key from a region's own agent (not through the WAN forward).
func kv(t *testing.T, dc *testenv.Consul, key string) *api.KVPair {
	t.Helper()
	c, err := dc.Client(dc.ManagementToken)
	require.NoError(t, err)
	p, _, err := c.KV().Get(key, nil)
	require.NoError(t, err)
	return p
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	require.True(t, json.Valid([]byte(s)), "not JSON:\n%s", s)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m))
	return m
}

const rulesV1 = `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 10
    window: 10s
  - id: admin
    match:
      path_prefix: ["/admin"]
    key: [ip]
    algorithm: fixed_window
    limit: 30
    window: 1m
`

const rulesV2 = `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 20
    window: 1m
  - id: api-key
    match:
      hosts: ["api.example.com"]
    key: ["header:X-API-Key"]
    algorithm: token_bucket
    limit: 300
    window: 1m
    burst: 50
`

const rulesV3 = `version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_log
    limit: 5
    window: 10s
`
