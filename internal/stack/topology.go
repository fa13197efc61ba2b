package stack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// TopologyFile is the stack's one description of its topology, relative to
// the repository root: Terraform loads it as its variables' values
// (*.auto.tfvars.json), the load-test fixture and the stack's tests read
// it; everything else reads the outputs Terraform derives from it.
const TopologyFile = "terraform/environments/local/topology.auto.tfvars.json"

// Topology is TopologyFile: the regions and the ports.
type Topology struct {
	Regions map[string]TopologyRegion `json:"regions"`
	Ports   Ports                     `json:"ports"`
}

// TopologyRegion is one region of a Topology, as the Terraform variable
// regions types it (variables.tf documents each field and its default).
type TopologyRegion struct {
	RedisMode string         `json:"redis_mode"`
	PoPs      map[string]int `json:"pops"`
	Failover  []string       `json:"failover"`
	Origin    *struct {
		Workers     int    `json:"workers"`
		ServiceTime string `json:"service_time"`
		Queue       int    `json:"queue"`
	} `json:"origin,omitempty"`
	RedisTimeout  string   `json:"redis_timeout,omitempty"`
	EdgeWorkers   int      `json:"edge_workers,omitempty"`
	EdgeExtraArgs []string `json:"edge_extra_args,omitempty"`
	KeySalt       *string  `json:"key_salt,omitempty"`
}

// Ports are the stack's ports (the Terraform variable ports).
type Ports struct {
	Edge struct {
		HTTP  int `json:"http"`
		HTTPS int `json:"https"`
		Admin int `json:"admin"`
		RLS   int `json:"rls"`
	} `json:"edge"`
	Consul struct {
		HTTP    int `json:"http"`
		DNS     int `json:"dns"`
		Server  int `json:"server"`
		SerfLAN int `json:"serf_lan"`
		SerfWAN int `json:"serf_wan"`
	} `json:"consul"`
	Redis         int `json:"redis"`
	Sentinel      int `json:"sentinel"`
	RedisExporter int `json:"redis_exporter"`
	Origin        int `json:"origin"`
	Prometheus    int `json:"prometheus"`
	RegionStride  int `json:"region_stride"`
}

// ReadTopology reads TopologyFile under the repository root, strictly: a
// field Terraform would reject is an error here too.
func ReadTopology(root string) (Topology, error) {
	var t Topology
	data, err := os.ReadFile(filepath.Join(root, TopologyFile))
	if err != nil {
		return t, fmt.Errorf("reading the stack's topology: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return t, fmt.Errorf("parsing %s: %w", TopologyFile, err)
	}
	if len(t.Regions) == 0 || t.Ports.Edge.HTTP == 0 || t.Ports.Consul.HTTP == 0 || t.Ports.Prometheus == 0 {
		return t, fmt.Errorf("parsing %s: regions, ports.edge, ports.consul and ports.prometheus are required", TopologyFile)
	}
	return t, nil
}
