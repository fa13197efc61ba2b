package testenv

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

// consulRequestTimeout bounds each request the harness itself makes, so a
// wedged agent costs one short timeout per poll rather than the whole wait.
const consulRequestTimeout = 5 * time.Second

// ConsulOptions configures StartConsul.
type ConsulOptions struct {
	// Datacenter is the agent's datacenter: letters, digits, "_" and "-";
	// Consul lowercases it. Default "dc1".
	Datacenter string
	// ACL enables ACLs with default_policy "deny"; ManagementToken is the
	// initial management token.
	ACL bool
	// ManagementToken is the initial management token when ACL is set.
	// Default a random UUID. Ignored without ACL.
	ManagementToken string
}

// Consul is one `consul agent -dev`: a single server that is its own leader,
// keeping everything in memory, on loopback ports picked for it alone
// (HTTP, DNS, gRPC, gRPC TLS, Serf LAN, Serf WAN, server RPC), so packages
// whose tests run in parallel never collide. Each agent is a datacenter of
// its own; JoinWAN federates two of them.
type Consul struct {
	Datacenter      string // as in ConsulOptions, defaulted
	ManagementToken string // "" without ACLs

	d     *deployment
	bin   string
	conf  string // config file, kept for restarts
	log   string
	ports consulPorts
	admin *api.Client // the harness's own client, with the management token
	// opts and pick rewrite the config when a restart finds a port taken.
	opts ConsulOptions
	pick pickPorts

	mu   sync.Mutex // serializes Stop and Start
	proc *process   // the current agent process
}

// consulPorts are the agent's listeners, each on a distinct port.
type consulPorts struct {
	HTTP, DNS, GRPC, GRPCTLS, SerfLAN, SerfWAN, Server int
}

const numConsulPorts = 7

// pickPorts returns numConsulPorts distinct free ports; tests replace it to
// simulate a port grabbed by another process.
type pickPorts func() ([]int, error)

func defaultPickPorts() ([]int, error) { return FreePorts(numConsulPorts) }

// StartConsul starts a dev agent and returns once it has elected itself
// leader and, with ACLs, once the management token is accepted. A port taken
// between picking and binding is retried with fresh ports.
func StartConsul(opts ConsulOptions) (*Consul, error) {
	return startConsul(opts, defaultPickPorts)
}

func startConsul(opts ConsulOptions, pick pickPorts) (*Consul, error) {
	if opts.Datacenter == "" {
		opts.Datacenter = "dc1"
	}
	// Consul lowercases datacenter names; c.Datacenter is what the agent
	// reports and what requests must name.
	opts.Datacenter = strings.ToLower(opts.Datacenter)
	if !opts.ACL {
		opts.ManagementToken = ""
	} else if opts.ManagementToken == "" {
		opts.ManagementToken = newUUID()
	}
	bin, err := servers.Consul()
	if err != nil {
		return nil, err
	}
	d, err := newDeployment("consul")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting consul: %w", err)
	}
	c := &Consul{Datacenter: opts.Datacenter, ManagementToken: opts.ManagementToken, d: d, bin: bin, opts: opts, pick: pick}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.startFresh(ctx, opts, pick); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting consul (datacenter %s): %w", opts.Datacenter, err)
	}
	return c, nil
}

// startFresh picks ports, writes the config and starts the agent, retrying
// with fresh ports when a listener could not bind.
func (c *Consul) startFresh(ctx context.Context, opts ConsulOptions, pick pickPorts) error {
	for attempt := 1; ; attempt++ {
		ports, err := pick()
		if err != nil {
			return err
		}
		if len(ports) != numConsulPorts {
			return fmt.Errorf("picked %d ports, want %d", len(ports), numConsulPorts)
		}
		c.ports = consulPorts{
			HTTP: ports[0], DNS: ports[1], GRPC: ports[2], GRPCTLS: ports[3],
			SerfLAN: ports[4], SerfWAN: ports[5], Server: ports[6],
		}
		// Files are named by HTTP port so a retry never appends to an
		// earlier attempt's log.
		base := filepath.Join(c.d.dir, fmt.Sprintf("consul-%d", c.ports.HTTP))
		c.conf, c.log = base+".hcl", base+".log"
		if err := os.WriteFile(c.conf, []byte(consulConfig(opts, c.ports)), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", c.conf, err)
		}
		if c.admin, err = c.newClient(c.ManagementToken, consulRequestTimeout); err != nil {
			return err
		}
		err = c.launch(ctx)
		if err == nil {
			return nil
		}
		if attempt < bindAttempts && errors.Is(err, errConsulPortBusy) {
			continue
		}
		return err
	}
}

// consulConfig renders the agent's HCL config. Everything binds and
// advertises 127.0.0.1; -dev supplies the rest (server, bootstrap,
// in-memory Raft, fast gossip).
func consulConfig(opts ConsulOptions, p consulPorts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "datacenter = %s\n", hclString(opts.Datacenter))
	// Node names only need to be unique within a datacenter and its WAN
	// pool (as node.dc); the HTTP port is unique on this host.
	fmt.Fprintf(&b, "node_name = %s\n", hclString(fmt.Sprintf("testenv-%d", p.HTTP)))
	b.WriteString(`bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
advertise_addr = "127.0.0.1"
advertise_addr_wan = "127.0.0.1"
log_level = "warn"
disable_update_check = true
disable_host_node_id = true
`)
	// Consul keeps a blocking query's connection, counted against the
	// client's address, until the query's wait ends, even after the client
	// went away (the socket stays in CLOSE-WAIT; hashicorp/consul#8524):
	// every edge a test stops leaves its watches' connections for up to
	// their 5-minute wait. Production gives each edge host its own agent;
	// here every edge of every test shares 127.0.0.1 and the agent, and
	// the default of 200 was reached by repeated runs (-count=30 of
	// TestRollingDowngradeLosesNoCount: 9 of 30 failed, every Consul call
	// of their edges answered 429).
	b.WriteString("limits {\n  http_max_conns_per_client = 4096\n}\n")
	fmt.Fprintf(&b, `ports {
  http = %d
  https = -1
  dns = %d
  grpc = %d
  grpc_tls = %d
  serf_lan = %d
  serf_wan = %d
  server = %d
}
`, p.HTTP, p.DNS, p.GRPC, p.GRPCTLS, p.SerfLAN, p.SerfWAN, p.Server)
	if opts.ACL {
		// The agent token lets the agent register itself and sync
		// coordinates instead of logging ACL denials every few seconds.
		fmt.Fprintf(&b, `acl {
  enabled = true
  default_policy = "deny"
  enable_token_persistence = false
  tokens {
    initial_management = %[1]s
    agent = %[1]s
  }
}
`, hclString(opts.ManagementToken))
	}
	return b.String()
}

// hclString quotes s for HCL, whose string escapes are a subset of Go's.
func hclString(s string) string { return strconv.Quote(s) }

// errConsulPortBusy marks an agent that exited because a listener's port
// was taken.
var errConsulPortBusy = errors.New("a port is in use")

// launch runs the agent with c.conf and waits until it is ready. On failure
// the process is gone and the error quotes the end of its log.
func (c *Consul) launch(ctx context.Context) error {
	p, err := c.spawnAgent()
	if err != nil {
		return err
	}
	err = c.waitReady(ctx, p)
	if err == nil {
		c.proc = p
		return nil
	}
	exitedByItself := !p.alive()
	p.kill()
	tail := p.logTail()
	if exitedByItself && strings.Contains(strings.ToLower(tail), "address already in use") {
		err = fmt.Errorf("%w: %w", errConsulPortBusy, err)
	}
	return fmt.Errorf("agent on %s: %w\n--- last lines of %s ---\n%s", c.HTTPAddr(), err, p.logPath, tail)
}

func (c *Consul) spawnAgent() (*process, error) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("consul agent is closed")
	}
	// Errors before the logger is set up go to stderr, so both streams go
	// to the log, appended across restarts.
	logFile, err := os.OpenFile(c.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", c.log, err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "==> testenv: %s agent -dev -config-file=%s (%s)\n", c.bin, c.conf, time.Now().Format(time.RFC3339Nano))

	p := &process{addr: c.HTTPAddr(), logPath: c.log}
	cmd := exec.Command(c.bin, "agent", "-dev", "-config-file="+c.conf)
	cmd.Dir = d.dir
	cmd.Env = consulEnv(d.dir)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if p.Proc, err = StartProc(cmd); err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	return p, nil
}

// consulEnv is the agent's environment: the test's, without the CONSUL_*
// variables of a developer's shell, with temp files in the deployment dir.
func consulEnv(dir string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CONSUL_") || strings.HasPrefix(kv, "TMPDIR=")
	})
	return append(env, "TMPDIR="+dir)
}

// waitReady waits until the agent serves HTTP, has a Raft leader (itself)
// and, with ACLs, accepts the management token, which happens only once
// the new leader has bootstrapped its ACL state.
func (c *Consul) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// An agent that exits (a port was taken, say) aborts the request in
	// flight: when another process holds the HTTP port, that request would
	// otherwise wait for a reply that never comes.
	reqCtx, cancelReq := context.WithCancel(ctx)
	defer cancelReq()
	go func() {
		select {
		case <-p.Exited():
			cancelReq()
		case <-reqCtx.Done():
		}
	}()
	return proc.Poll(ctx, "consul at "+c.HTTPAddr()+" to be ready", func(context.Context) error {
		err := c.ready(reqCtx)
		if err == nil {
			// The agent serves HTTP before it binds its gRPC ports
			// (agent.Start in Consul 1.21), and exits if one is taken: it
			// is ready once it holds them.
			err = holdsListeners(p.Cmd.Process.Pid, c.ports.GRPC, c.ports.GRPCTLS)
		}
		if err != nil && !p.alive() {
			return proc.Permanent(fmt.Errorf("process exited: %s", p.Cmd.ProcessState))
		}
		return err
	})
}

// holdsListeners says whether process pid holds a listening TCP socket on
// each of ports (ignoring those <= 0), from /proc/net/tcp and
// /proc/net/tcp6 and the process's descriptors: another process
// listening on the port does not count.
func holdsListeners(pid int, ports ...int) error {
	owned := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
			if inode, ok := strings.CutPrefix(link, "socket:["); ok {
				owned[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	held := map[int]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st ... inode (the tenth field)
			if len(f) < 10 || f[3] != "0A" || !owned[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if port, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				held[int(port)] = true
			}
		}
	}
	for _, port := range ports {
		if port > 0 && !held[port] {
			return fmt.Errorf("the agent does not listen on port %d yet", port)
		}
	}
	return nil
}

func (c *Consul) ready(ctx context.Context) error {
	leader, err := c.admin.Status().LeaderWithQueryOptions(queryCtx(ctx))
	if err != nil {
		return err
	}
	if leader == "" {
		return errors.New("no leader yet")
	}
	if c.ManagementToken == "" {
		return nil
	}
	if _, _, err := c.admin.ACL().TokenReadSelf(queryCtx(ctx)); err != nil {
		return fmt.Errorf("management token: %w", err)
	}
	return nil
}

// HTTPAddr returns the HTTP API address, "127.0.0.1:port".
func (c *Consul) HTTPAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ports.HTTP))
}

// DNSAddr returns the DNS server address (UDP and TCP), "127.0.0.1:port".
func (c *Consul) DNSAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ports.DNS))
}

// SerfWANAddr returns the Serf WAN address other datacenters join.
func (c *Consul) SerfWANAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.ports.SerfWAN))
}

// Client returns a github.com/hashicorp/consul/api client for this agent,
// sending token ("" for none: the anonymous token when ACLs are enabled).
// Unlike api.DefaultConfig it ignores the CONSUL_HTTP_* and
// CONSUL_NAMESPACE/CONSUL_PARTITION variables of the developer's shell.
func (c *Consul) Client(token string) (*api.Client, error) {
	return c.newClient(token, 0)
}

// newClient returns a client whose requests time out after timeout (none
// if 0: blocking queries may take minutes).
func (c *Consul) newClient(token string, timeout time.Duration) (*api.Client, error) {
	var transport http.RoundTripper = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	ns, partition := os.Getenv(api.HTTPNamespaceEnvName), os.Getenv(api.HTTPPartitionEnvName)
	if ns != "" || partition != "" {
		transport = envScopeTransport{ns: ns, partition: partition, base: transport}
	}
	cl, err := api.NewClient(&api.Config{
		// Address, Scheme and HttpClient set: no CONSUL_HTTP_ADDR,
		// CONSUL_HTTP_SSL or CONSUL_CACERT.
		Address:    c.HTTPAddr(),
		Scheme:     "http",
		HttpClient: &http.Client{Transport: transport, Timeout: timeout},
		Token:      token,
		// An explicit token file, empty, keeps NewClient from falling back
		// to CONSUL_HTTP_TOKEN_FILE or CONSUL_HTTP_TOKEN when token is "".
		TokenFile: os.DevNull,
	})
	if err != nil {
		return nil, fmt.Errorf("testenv: consul client for %s: %w", c.HTTPAddr(), err)
	}
	return cl, nil
}

// envScopeTransport drops the namespace and partition that api.NewClient
// takes from CONSUL_NAMESPACE and CONSUL_PARTITION, which open-source
// Consul rejects. Other values, set explicitly, go through.
type envScopeTransport struct {
	ns, partition string
	base          http.RoundTripper
}

func (t envScopeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	drop := func(param, envValue string) bool {
		if envValue == "" || q.Get(param) != envValue {
			return false
		}
		q.Del(param)
		return true
	}
	if dropNS, dropPartition := drop("ns", t.ns), drop("partition", t.partition); dropNS || dropPartition {
		req = req.Clone(req.Context())
		req.URL.RawQuery = q.Encode()
	}
	return t.base.RoundTrip(req)
}

// JoinWAN federates c's and other's datacenters: c joins other's Serf WAN
// address, then JoinWAN waits until each agent lists the other's datacenter
// and forwards a request to it. A restarted agent has forgotten the join
// (dev agents keep no Serf snapshot): join again after Start.
func (c *Consul) JoinWAN(other *Consul) error {
	if c.Datacenter == other.Datacenter {
		return fmt.Errorf("testenv: joining consul WAN: both agents are in datacenter %s", c.Datacenter)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.admin.Agent().Join(other.SerfWANAddr(), true); err != nil {
		return fmt.Errorf("testenv: joining %s to %s over WAN: %w", c.Datacenter, other.Datacenter, err)
	}
	for _, pair := range [][2]*Consul{{c, other}, {other, c}} {
		from, to := pair[0], pair[1]
		err := proc.Poll(ctx, fmt.Sprintf("datacenter %s to reach %s", from.Datacenter, to.Datacenter), func(ctx context.Context) error {
			dcs, err := from.datacenters(ctx)
			if err != nil {
				return err
			}
			if !slices.Contains(dcs, to.Datacenter) {
				return fmt.Errorf("%s lists datacenters %v", from.HTTPAddr(), dcs)
			}
			// Listed is not yet routable: the router learns the remote
			// servers a moment later. Status.Leader is forwarded to the
			// remote datacenter and needs no ACL token there.
			q := queryCtx(ctx)
			q.Datacenter = to.Datacenter
			leader, err := from.admin.Status().LeaderWithQueryOptions(q)
			if err != nil {
				return fmt.Errorf("forwarding to %s: %w", to.Datacenter, err)
			}
			if leader == "" {
				return fmt.Errorf("%s reports no leader", to.Datacenter)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("testenv: joining %s and %s over WAN: %w", c.Datacenter, other.Datacenter, err)
		}
	}
	return nil
}

// datacenters lists the datacenters the agent knows, like
// Catalog().Datacenters but bounded by ctx.
func (c *Consul) datacenters(ctx context.Context) ([]string, error) {
	var dcs []string
	_, err := c.admin.Raw().Query("/v1/catalog/datacenters", &dcs, queryCtx(ctx))
	return dcs, err
}

// Stop stops the agent, SIGTERM then SIGKILL, and returns once it is gone.
// Its config and ports are kept for Start. Stopping a stopped agent is a
// no-op.
func (c *Consul) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || !c.proc.alive() {
		return nil
	}
	c.proc.signal(syscall.SIGTERM)
	select {
	case <-c.proc.Exited():
	case <-time.After(termGrace):
		c.proc.kill()
	}
	return nil
}

// Start restarts a stopped agent with the same config on the same ports and
// returns once it is ready, as StartConsul does. A dev agent keeps nothing
// on disk: the restarted agent has lost its KV data, the tokens made by
// Token (not the management token, which is in its config) and its WAN
// joins. Starting a running agent is a no-op. The ports others reach the
// agent on (HTTP, Serf WAN, server RPC) stay: Start fails, rather than
// moving them, if another process took one meanwhile. The DNS, gRPC and
// Serf LAN ports, which nothing here uses (each datacenter is one agent,
// joined to others over the WAN only), move to fresh ones when taken
// (another test's process may bind a port the stopped agent freed).
func (c *Consul) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil && c.proc.alive() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := c.launch(ctx)
		if err == nil {
			return nil
		}
		if attempt < bindAttempts && errors.Is(err, errConsulPortBusy) {
			if err := c.moveUnusedPorts(); err == nil {
				continue
			}
		}
		return fmt.Errorf("testenv: restarting consul (datacenter %s): %w", c.Datacenter, err)
	}
}

// moveUnusedPorts gives the agent fresh DNS, gRPC and Serf LAN ports and
// rewrites its config.
func (c *Consul) moveUnusedPorts() error {
	ports, err := c.pick()
	if err != nil {
		return err
	}
	if len(ports) < 4 {
		return fmt.Errorf("picked %d ports, want 4", len(ports))
	}
	c.ports.DNS, c.ports.GRPC, c.ports.GRPCTLS, c.ports.SerfLAN = ports[0], ports[1], ports[2], ports[3]
	return os.WriteFile(c.conf, []byte(consulConfig(c.opts, c.ports)), 0o600)
}

// LogTail is the last lines of the agent's log (warnings and errors).
func (c *Consul) LogTail() string { return proc.Tail(c.log) }

// Close stops the agent and removes its files. It is idempotent.
func (c *Consul) Close() error {
	return c.d.Close()
}

// Token creates an ACL policy with the given HCL rules and a token linked
// to it, and returns the token's SecretID, for example a read-only token
// for `key_prefix "" { policy = "read" }`. It needs ACLs.
func (c *Consul) Token(policyRules string) (string, error) {
	if c.ManagementToken == "" {
		return "", errors.New("testenv: creating consul token: ACLs are not enabled (ConsulOptions.ACL)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), consulRequestTimeout)
	defer cancel()
	name := "testenv-" + newUUID()
	policy, _, err := c.admin.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: policyRules}, writeCtx(ctx))
	if err != nil {
		return "", fmt.Errorf("testenv: creating consul policy: %w", err)
	}
	token, _, err := c.admin.ACL().TokenCreate(&api.ACLToken{
		Description: name,
		Policies:    []*api.ACLTokenPolicyLink{{ID: policy.ID}},
	}, writeCtx(ctx))
	if err != nil {
		return "", fmt.Errorf("testenv: creating consul token: %w", err)
	}
	return token.SecretID, nil
}

// queryCtx and writeCtx bound a harness request by ctx, on top of the
// admin client's consulRequestTimeout.
func queryCtx(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{}).WithContext(ctx)
}

func writeCtx(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{}).WithContext(ctx)
}

// newUUID returns a random (version 4) UUID, the form Consul gives tokens.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
