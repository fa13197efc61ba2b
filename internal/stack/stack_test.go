package stack

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSpec(t *testing.T) {
	edge := `{"kind":"edge","bin":"/b","edge":{"name":"eu-west-ams-1","region":"eu-west","pop":"ams","addr":"127.0.1.1","port":8080,"admin_port":18391,"consul":"127.0.0.1:8500","origin":"http://127.0.0.1:18080","key_salt":"s"}}`
	for name, tc := range map[string]struct {
		spec, err string
	}{
		"edge":              {spec: edge},
		"unknown field":     {spec: `{"kind":"edge","bin":"/b","nope":1}`, err: "unknown field"},
		"no bin":            {spec: strings.Replace(edge, `"bin":"/b",`, "", 1), err: "bin: required"},
		"edge without salt": {spec: strings.Replace(edge, `"key_salt":"s"`, `"key_salt":""`, 1), err: "key_salt"},
		"kind mismatch":     {spec: strings.Replace(edge, `"kind":"edge"`, `"kind":"redis"`, 1), err: "does not match"},
		"bad redis mode":    {spec: `{"kind":"redis","bin":"/b","redis":{"region":"r","mode":"ring","ports":[1],"exporter_ports":[2]}}`, err: "cluster or sentinel"},
		"cluster of 3":      {spec: `{"kind":"redis","bin":"/b","redis":{"region":"r","mode":"cluster","ports":[1,2,3],"exporter_ports":[4,5,6]}}`, err: "6 nodes"},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tc.spec))
			if tc.err == "" {
				require.NoError(t, err)
				require.Equal(t, "edge-eu-west-ams-1", s.ID())
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestSpecsInDependencyOrder(t *testing.T) {
	st := State{Dir: t.TempDir()}
	specs := []Spec{
		{Kind: KindPrometheus, Bin: "/b", Prometheus: &PrometheusSpec{Port: 9091}},
		{Kind: KindEdge, Bin: "/b", Edge: &EdgeSpec{Name: "a-x-1", Region: "a", PoP: "x", Addr: "127.0.1.1", Port: 1, AdminPort: 2, Consul: "c", Origin: "o", KeySalt: "s"}},
		{Kind: KindConsul, Bin: "/b", Consul: &ConsulSpec{Datacenter: "a", HTTP: 1, DNS: 2, SerfLAN: 3, SerfWAN: 4, Server: 5, Query: "edge", Service: "svc"}},
		{Kind: KindRedis, Bin: "/b", Redis: &RedisSpec{Region: "a", Mode: "sentinel", Ports: []int{1, 2}, SentinelPorts: []int{3, 4, 5}, MasterName: "m", ExporterPorts: []int{6, 7}}},
	}
	for _, s := range specs {
		require.NoError(t, s.Validate())
		require.NoError(t, st.save(s))
	}
	got, err := st.Specs()
	require.NoError(t, err)
	var kinds []string
	for _, s := range got {
		kinds = append(kinds, s.Kind)
	}
	require.Equal(t, []string{KindRedis, KindConsul, KindEdge, KindPrometheus}, kinds)
}

func TestPrometheusConfigDiscoversEdgesThroughEveryConsul(t *testing.T) {
	cfg := prometheusConfig(PrometheusSpec{
		Port: 9091, ScrapeInterval: "1s", Service: "edgeguard-edge", AdminPort: 18391,
		Consuls:   map[string]string{"us-east": "127.0.0.1:8510", "eu-west": "127.0.0.1:8500"},
		Exporters: map[string][]string{"eu-west": {"127.0.0.1:9121"}},
	})
	for _, want := range []string{
		"consul_sd_configs:",
		`server: "127.0.0.1:8500"`, `datacenter: "eu-west"`,
		`server: "127.0.0.1:8510"`, `datacenter: "us-east"`,
		`replacement: "${1}:18391"`,
		// region and pop are target labels from the service meta (the
		// edges no longer export them).
		"source_labels: [__meta_consul_service_metadata_region]\n        target_label: region\n",
		"source_labels: [__meta_consul_service_metadata_pop]\n        target_label: pop\n",
		`targets: ["127.0.0.1:9121"]`,
		// The rate limit services: their own job, found as their own
		// service, scraped at the metrics port their meta names, keeping
		// only their series (which the edge job drops).
		"job_name: edgeguard-rls\n    consul_sd_configs:\n",
		`services: ["edgeguard-rls"]`,
		"source_labels: [__meta_consul_service_address, __meta_consul_service_metadata_metrics_port]\n        separator: \":\"\n        target_label: __address__\n",
		"source_labels: [__meta_consul_service_metadata_edge]\n        target_label: instance\n",
		"regex: \"edgeguard_rls_.+\"\n        action: keep\n",
		"regex: \"edgeguard_rls_.+\"\n        action: drop\n",
	} {
		require.Contains(t, cfg, want)
	}
	// promtool, when installed, must accept it as a whole.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		return
	}
	path := filepath.Join(t.TempDir(), "p.yml")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	out, err := exec.Command(promtool, "check", "config", "--syntax-only", path).CombinedOutput()
	if strings.Contains(string(out), "consul_sd_configs not found") {
		return // Debian's promtool lacks Consul discovery, as its prometheus does
	}
	require.NoError(t, err, string(out))
}

func TestParseOutputs(t *testing.T) {
	raw := map[string]any{
		"regions": map[string]any{"value": map[string]any{"eu-west": map[string]any{
			"pops": map[string]any{"fra": map[string]any{"edges": []any{map[string]any{"name": "eu-west-fra-1", "addr": "127.0.1.3"}}},
				"ams": map[string]any{"edges": []any{map[string]any{"name": "eu-west-ams-1", "addr": "127.0.1.1"}}}},
		}}},
		"prometheus_url": map[string]any{"value": "http://127.0.0.1:9091"},
	}
	data, err := json.Marshal(raw)
	require.NoError(t, err)
	o, err := ParseOutputs(data)
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:9091", o.PrometheusURL)
	var names []string
	for _, e := range o.Regions["eu-west"].Edges() {
		names = append(names, e.Name)
	}
	require.Equal(t, []string{"eu-west-ams-1", "eu-west-fra-1"}, names, "PoPs in name order")

	_, err = ParseOutputs([]byte(`{}`))
	require.Error(t, err)
}

// The topology file is what Terraform loads: every region fails over to
// regions that exist, and the ports the stack's tests probe are set.
func TestReadTopology(t *testing.T) {
	topo, err := ReadTopology(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(topo.Regions), 2, "the drills need two regions")
	for name, r := range topo.Regions {
		require.Contains(t, []string{"cluster", "sentinel"}, r.RedisMode, name)
		require.NotEmpty(t, r.PoPs, name)
		for _, f := range r.Failover {
			require.Contains(t, topo.Regions, f, "%s fails over to a region of the stack", name)
		}
	}
	require.NotZero(t, topo.Ports.Edge.Admin)
	require.NotZero(t, topo.Ports.RegionStride)
}
