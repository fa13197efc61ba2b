package stack

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
)

// Outputs are the stack's Terraform outputs (terraform output -json, also
// STACK_STATE/outputs.json): the one place that knows the topology.
type Outputs struct {
	Regions       map[string]Region `json:"regions"`
	PrometheusURL string            `json:"prometheus_url"`
	DNSQuery      string            `json:"dns_query"`
	RulesFile     string            `json:"rules_file"`
	StateDir      string            `json:"state_dir"`
	TLS           struct {
		Name   string `json:"name"`
		CAFile string `json:"ca_file"`
	} `json:"tls"`
}

// Region is one region of Outputs.
type Region struct {
	Redis struct {
		Mode       string   `json:"mode"`
		URL        string   `json:"url"`
		Seeds      []string `json:"seeds"`
		Nodes      []string `json:"nodes"`
		MasterName string   `json:"master_name"`
		Exporters  []string `json:"exporters"`
	} `json:"redis"`
	Consul struct {
		Datacenter string `json:"datacenter"`
		HTTP       string `json:"http"`
		DNS        string `json:"dns"`
	} `json:"consul"`
	Origin string `json:"origin"`
	// OriginCapacityRPS is what the origin serves at most (workers /
	// service time).
	OriginCapacityRPS float64        `json:"origin_capacity_rps"`
	PoPs              map[string]PoP `json:"pops"`
	Failover          []string       `json:"failover"`
	KeySalt           string         `json:"key_salt"`
}

// PoP is one PoP of a Region.
type PoP struct {
	Edges []Edge `json:"edges"`
}

// Edge is one edge of a PoP.
type Edge struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	URL   string `json:"url"`
	TLS   string `json:"tls"` // host:port of HTTPS for TLS.Name
	Admin string `json:"admin"`
	RLS   string `json:"rls"` // host:port of the rate limit service (gRPC)
}

// Edges lists the region's edges, PoPs in name order.
func (r Region) Edges() []Edge {
	var out []Edge
	for _, pop := range sortedKeys(r.PoPs) {
		out = append(out, r.PoPs[pop].Edges...)
	}
	return out
}

// ReadOutputs reads terraform output -json as saved in outputs.json.
func ReadOutputs(path string) (Outputs, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Outputs{}, fmt.Errorf("reading stack outputs: %w", err)
	}
	return ParseOutputs(data)
}

// ParseOutputs unwraps terraform's {"name": {"value": ..., "type": ...}}.
func ParseOutputs(data []byte) (Outputs, error) {
	var raw map[string]struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Outputs{}, fmt.Errorf("parsing stack outputs: %w", err)
	}
	flat := map[string]json.RawMessage{}
	for k, v := range raw {
		flat[k] = v.Value
	}
	b, err := json.Marshal(flat)
	if err != nil {
		return Outputs{}, err
	}
	var o Outputs
	if err := json.Unmarshal(b, &o); err != nil {
		return Outputs{}, fmt.Errorf("parsing stack outputs: %w", err)
	}
	if len(o.Regions) == 0 {
		return Outputs{}, fmt.Errorf("parsing stack outputs: no regions")
	}
	return o, nil
}

// PrintEndpoints writes a human summary of o.
func PrintEndpoints(w io.Writer, o Outputs) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "REGION\tPOP\tEDGE\tURL\tHTTPS\tADMIN\tRLS (gRPC)\n")
	for _, name := range sortedKeys(o.Regions) {
		r := o.Regions[name]
		for _, pop := range sortedKeys(r.PoPs) {
			for _, e := range r.PoPs[pop].Edges {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, pop, e.Name, e.URL, e.TLS, e.Admin, e.RLS)
			}
		}
	}
	fmt.Fprintf(tw, "\nREGION\tREDIS\tCONSUL HTTP\tCONSUL DNS\tORIGIN\n")
	for _, name := range sortedKeys(o.Regions) {
		r := o.Regions[name]
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s\t%s\n", name, r.Redis.Mode, r.Redis.URL, r.Consul.HTTP, r.Consul.DNS, r.Origin)
	}
	fmt.Fprintf(tw, "\nprometheus: %s   dns: dig @127.0.0.1 -p <port> %s.query.consul   rules: %s   state: %s\n", o.PrometheusURL, o.DNSQuery, o.RulesFile, o.StateDir)
	if o.TLS.Name != "" {
		fmt.Fprintf(tw, "https: curl --cacert %s --resolve %s:PORT:ADDR https://%s:PORT/ (HTTPS column: ADDR:PORT)\n", o.TLS.CAFile, o.TLS.Name, o.TLS.Name)
	}
	return tw.Flush()
}
