package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

// startConsulT starts an agent for t and closes it when t ends.
func startConsulT(t *testing.T, opts ConsulOptions) *Consul {
	t.Helper()
	start := time.Now()
	c, err := StartConsul(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	t.Logf("consul agent (datacenter %s, ACL %v) ready after %v", c.Datacenter, opts.ACL, time.Since(start))
	return c
}

func consulClient(t *testing.T, c *Consul, token string) *api.Client {
	t.Helper()
	cl, err := c.Client(token)
	require.NoError(t, err)
	return cl
}

func TestConsulKV(t *testing.T) {
	t.Parallel()
	c := startConsulT(t, ConsulOptions{})
	require.Equal(t, "dc1", c.Datacenter)
	require.Empty(t, c.ManagementToken)
	kv := consulClient(t, c, "").KV()
	key := KeyPrefix(t) + "rules"

	_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)
	got, _, err := kv.Get(key, nil)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Equal(t, "v1", string(got.Value))

	_, err = c.Token(`key_prefix "" { policy = "read" }`)
	require.ErrorContains(t, err, "ACLs are not enabled")

	assertClosed(t, c.Close, c.d, c.HTTPAddr())
}

// startConsulPair starts two agents at once (startup is mostly waiting)
// and WAN-joins them.
func startConsulPair(t *testing.T, a, b ConsulOptions) (*Consul, *Consul) {
	t.Helper()
	agents := make([]*Consul, 2)
	errs := make(chan error, 2)
	for i, opts := range []ConsulOptions{a, b} {
		go func() {
			c, err := StartConsul(opts)
			agents[i] = c
			errs <- err
		}()
	}
	for range agents {
		require.NoError(t, <-errs)
	}
	for _, c := range agents {
		if c != nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	start := time.Now()
	require.NoError(t, agents[0].JoinWAN(agents[1]))
	t.Logf("WAN join took %v", time.Since(start))
	return agents[0], agents[1]
}

func TestConsulWANForwarding(t *testing.T) {
	t.Parallel()
	east, west := startConsulPair(t, ConsulOptions{Datacenter: "east"}, ConsulOptions{Datacenter: "west"})
	for _, c := range []*Consul{east, west} {
		dcs, err := consulClient(t, c, "").Catalog().Datacenters()
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"east", "west"}, dcs)
	}

	// Written through east, addressed to west: the write is forwarded over
	// the WAN and lands in west's store only.
	key := KeyPrefix(t) + "rules"
	eastKV, westKV := consulClient(t, east, "").KV(), consulClient(t, west, "").KV()
	_, err := eastKV.Put(&api.KVPair{Key: key, Value: []byte("from-east")}, &api.WriteOptions{Datacenter: "west"})
	require.NoError(t, err)
	got, _, err := westKV.Get(key, &api.QueryOptions{})
	require.NoError(t, err)
	require.NotNil(t, got, "key written for west through east is missing on west")
	require.Equal(t, "from-east", string(got.Value))
	got, _, err = eastKV.Get(key, nil)
	require.NoError(t, err)
	require.Nil(t, got, "the write must not land in east")

	require.Error(t, east.JoinWAN(east), "an agent cannot join its own datacenter")
}

// Without ACL replication every datacenter is its own primary: a forwarded
// request needs a token of the datacenter it is addressed to.
func TestConsulWANWithACLs(t *testing.T) {
	t.Parallel()
	east, west := startConsulPair(t, ConsulOptions{Datacenter: "east", ACL: true}, ConsulOptions{Datacenter: "west", ACL: true})
	key := KeyPrefix(t) + "rules"
	eastKV := consulClient(t, east, "").KV()

	_, err := eastKV.Put(&api.KVPair{Key: key, Value: []byte("v1")}, &api.WriteOptions{Datacenter: "west", Token: west.ManagementToken})
	require.NoError(t, err)
	got, _, err := consulClient(t, west, west.ManagementToken).KV().Get(key, nil)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Equal(t, "v1", string(got.Value))

	_, err = eastKV.Put(&api.KVPair{Key: key, Value: []byte("v2")}, &api.WriteOptions{Datacenter: "west", Token: east.ManagementToken})
	require.Error(t, err, "east's token means nothing in west")
	statusErr, ok := errors.AsType[api.StatusError](err)
	require.True(t, ok, "want an api.StatusError, got %T: %v", err, err)
	require.Equal(t, 403, statusErr.Code)
	require.Contains(t, statusErr.Body, "ACL not found")
}

// The agents and clients ignore the CONSUL_* variables a developer may have
// exported for a real cluster.
func TestConsulIgnoresEnvironment(t *testing.T) {
	// t.Setenv rules out t.Parallel.
	t.Setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
	t.Setenv("CONSUL_HTTP_SSL", "true")
	t.Setenv("CONSUL_HTTP_TOKEN", "00000000-0000-4000-8000-00000000bad1")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", filepath.Join(t.TempDir(), "missing"))
	t.Setenv("CONSUL_NAMESPACE", "team")
	t.Setenv("CONSUL_PARTITION", "part")
	c := startConsulT(t, ConsulOptions{ACL: true})
	key := KeyPrefix(t) + "rules"

	_, err := consulClient(t, c, c.ManagementToken).KV().Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)
	anon := consulClient(t, c, "").KV()
	// The anonymous token is denied ("Permission denied"); the token from
	// CONSUL_HTTP_TOKEN would be unknown ("ACL not found").
	_, err = anon.Put(&api.KVPair{Key: key, Value: []byte("v2")}, nil)
	requirePermissionDenied(t, err)
	// A token per request still goes through.
	_, err = anon.Put(&api.KVPair{Key: key, Value: []byte("v3")}, &api.WriteOptions{Token: c.ManagementToken})
	require.NoError(t, err)
}

func TestConsulACL(t *testing.T) {
	t.Parallel()
	c := startConsulT(t, ConsulOptions{ACL: true})
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, c.ManagementToken)
	key := KeyPrefix(t) + "rules"

	mgmt := consulClient(t, c, c.ManagementToken).KV()
	_, err := mgmt.Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)

	ro, err := c.Token(`key_prefix "" { policy = "read" }`)
	require.NoError(t, err)
	roKV := consulClient(t, c, ro).KV()
	got, _, err := roKV.Get(key, nil)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Equal(t, "v1", string(got.Value))
	_, err = roKV.Put(&api.KVPair{Key: key, Value: []byte("v2")}, nil)
	requirePermissionDenied(t, err)

	// default_policy deny: no token, no access.
	got, _, err = consulClient(t, c, "").KV().Get(key, nil)
	if err == nil {
		require.Nil(t, got, "the anonymous token must not read keys")
	}
	_, err = consulClient(t, c, "").KV().Put(&api.KVPair{Key: key, Value: []byte("v3")}, nil)
	requirePermissionDenied(t, err)

	got, _, err = mgmt.Get(key, nil)
	require.NoError(t, err)
	require.Equal(t, "v1", string(got.Value))
}

func TestConsulACLOwnManagementToken(t *testing.T) {
	t.Parallel()
	const token = "3f5a9d4e-8a0b-4c1d-9e2f-000000000001"
	c := startConsulT(t, ConsulOptions{Datacenter: "edge-1", ACL: true, ManagementToken: token})
	require.Equal(t, token, c.ManagementToken)
	self, _, err := consulClient(t, c, token).ACL().TokenReadSelf(nil)
	require.NoError(t, err)
	require.Equal(t, token, self.SecretID)
}

func requirePermissionDenied(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	statusErr, ok := errors.AsType[api.StatusError](err)
	require.True(t, ok, "want an api.StatusError, got %T: %v", err, err)
	require.Equal(t, 403, statusErr.Code)
	require.Contains(t, statusErr.Body, "Permission denied")
}

func TestConsulStopStart(t *testing.T) {
	t.Parallel()
	c := startConsulT(t, ConsulOptions{})
	addr := c.HTTPAddr()
	kv := consulClient(t, c, "").KV()
	key := KeyPrefix(t) + "rules"
	_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)

	start := time.Now()
	require.NoError(t, c.Stop())
	t.Logf("Stop took %v", time.Since(start))
	require.NoError(t, c.Stop(), "stopping a stopped agent is a no-op")
	_, err = net.DialTimeout("tcp", addr, 200*time.Millisecond)
	require.Error(t, err, "a stopped agent must not accept connections")
	_, _, err = kv.Get(key, nil)
	require.Error(t, err)

	start = time.Now()
	require.NoError(t, c.Start())
	t.Logf("restart took %v", time.Since(start))
	require.NoError(t, c.Start(), "starting a running agent is a no-op")
	require.Equal(t, addr, c.HTTPAddr())
	// The same client works again; dev agents keep no data across restarts.
	got, _, err := kv.Get(key, nil)
	require.NoError(t, err)
	require.Nil(t, got, "dev agents start empty")
	_, err = kv.Put(&api.KVPair{Key: key, Value: []byte("v2")}, nil)
	require.NoError(t, err)

	assertClosed(t, c.Close, c.d, addr)
	require.Error(t, c.Start(), "a closed agent cannot be restarted")
}

func TestConsulRetriesBusyPort(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	// The first attempt's HTTP port is taken, as if another process had
	// grabbed it after FreePorts released it.
	attempts := 0
	c, err := startConsul(ConsulOptions{}, func() ([]int, error) {
		attempts++
		ports, err := FreePorts(numConsulPorts)
		if attempts == 1 && err == nil {
			ports[0] = busy.Addr().(*net.TCPAddr).Port
		}
		return ports, err
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	// At least one retry: a later attempt's free ports can also be taken by
	// a test running beside this one, and are retried the same way.
	require.GreaterOrEqual(t, attempts, 2)
	require.NotEqual(t, busy.Addr().String(), c.HTTPAddr())
	_, err = consulClient(t, c, "").Status().Leader()
	require.NoError(t, err)
}

// A restart whose gRPC or Serf LAN port another process took meanwhile
// moves that port (nothing here dials it) and keeps the HTTP address; one
// whose HTTP port was taken fails rather than move the address the tests
// hold.
func TestConsulRestartMovesATakenGRPCPort(t *testing.T) {
	t.Parallel()
	c, err := StartConsul(ConsulOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	addr := c.HTTPAddr()
	// restartWithTaken stops the agent, lets another listener take the
	// port *field names, restarts it, and checks that port moved while the
	// HTTP address stayed and the agent serves.
	restartWithTaken := func(name string, field *int) {
		port := *field
		require.NoError(t, c.Stop())
		taken, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = taken.Close() })
		require.NoError(t, c.Start())
		require.Equal(t, addr, c.HTTPAddr(), "the HTTP address stays")
		require.NotEqual(t, port, *field, "the taken %s port moved", name)
		_, err = consulClient(t, c, "").Status().Leader()
		require.NoError(t, err)
	}
	restartWithTaken("gRPC", &c.ports.GRPC)
	// So does a taken Serf LAN port (no agent joins another's LAN here).
	restartWithTaken("Serf LAN", &c.ports.SerfLAN)

	require.NoError(t, c.Stop())
	takenHTTP, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	defer takenHTTP.Close()
	err = c.Start()
	require.ErrorIs(t, err, errConsulPortBusy, "the HTTP port does not move")
}

func TestConsulStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	_, err := StartConsul(ConsulOptions{Datacenter: "Not A Valid DC!"})
	require.Error(t, err)
	t.Log(err)
	require.Contains(t, err.Error(), "last lines of", "error should quote the agent log")
	require.Contains(t, err.Error(), "lowercase alphanumeric", "the log explains the refusal")
}

func TestConsulConfigPortsDistinct(t *testing.T) {
	p := consulPorts{HTTP: 1, DNS: 2, GRPC: 3, GRPCTLS: 4, SerfLAN: 5, SerfWAN: 6, Server: 7}
	conf := consulConfig(ConsulOptions{Datacenter: "dc1", ACL: true, ManagementToken: `t"o`}, p)
	for i, name := range []string{"http", "dns", "grpc", "grpc_tls", "serf_lan", "serf_wan", "server"} {
		require.Contains(t, conf, "  "+name+" = "+strconv.Itoa(i+1)+"\n")
	}
	require.Contains(t, conf, `initial_management = "t\"o"`)
	require.Contains(t, conf, `default_policy = "deny"`)
	require.NotContains(t, consulConfig(ConsulOptions{Datacenter: "dc1"}, p), "acl")
}

// Every edge and client of the tests shares one address, and Consul counts
// a blocking query's connection against it until the query's wait ends,
// even once its client has gone (consulConfig): the agent serves more than
// its default 200 at once from one address. 250 blocking queries held
// open, then a plain read, then a write that ends them: every one answers
// 200 (with the default limit, those past 200 are answered 429 at once).
func TestConsulServesManyBlockingQueriesFromOneAddress(t *testing.T) {
	t.Parallel()
	c := startConsulT(t, ConsulOptions{})
	kv := consulClient(t, c, "").KV()
	key := KeyPrefix(t) + "watched"
	_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)
	_, meta, err := kv.Get(key, nil)
	require.NoError(t, err)

	const held = 250
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: held}}
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fmt.Sprintf("http://%s/v1/kv/%s?index=%d&wait=5m", c.HTTPAddr(), key, meta.LastIndex)
	var written sync.WaitGroup
	written.Add(held)
	codes := make(chan int, held)
	for range held {
		go func() {
			var once sync.Once
			trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(written.Done) }}
			req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, url, nil)
			if err != nil {
				once.Do(written.Done)
				codes <- -1
				return
			}
			resp, err := client.Do(req)
			once.Do(written.Done)
			if err != nil {
				codes <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	written.Wait()
	got, _, err := kv.Get(key, nil)
	require.NoError(t, err, "a plain read beside %d blocking queries", held)
	require.Equal(t, "v1", string(got.Value))
	_, err = kv.Put(&api.KVPair{Key: key, Value: []byte("v2")}, nil)
	require.NoError(t, err)
	byCode := map[int]int{}
	for range held {
		byCode[<-codes]++
	}
	require.Equal(t, map[int]int{http.StatusOK: held}, byCode, "status of each blocking query (-1: no answer)")
}
