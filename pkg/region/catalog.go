package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// Catalog is the deployment's regions and where each one's Redis is, for
// global rules: a key's home region is a hash of the key over the
// catalog's names, and edges of the other regions lease from the home's
// Redis. Consul KV is not replicated between datacenters, so the same
// document is stored in every region's datacenter (PutCatalog), and an
// edge reads its own region's copy only: no edge depends on another
// region's Consul to know the homes.
type Catalog struct {
	Regions []CatalogRegion `json:"regions"`
}

// CatalogRegion is one region of the catalog.
type CatalogRegion struct {
	Name string `json:"name"`
	// Redis is the region's Redis as other regions' edges reach it: a
	// URL as the edge's --redis takes (redis://, rediss://).
	Redis string `json:"redis"`
	// RedisMode is standalone (default), cluster or sentinel, as --redis-mode.
	RedisMode string `json:"redis_mode,omitempty"`
	// Dial maps addresses of this Redis, as its URL, its Cluster's slot
	// map or its sentinels name them, to the addresses other regions'
	// edges connect to instead (host:port each): a NAT, tunnel or proxy in
	// front of each node, where the nodes announce addresses only their
	// own region reaches.
	Dial map[string]string `json:"dial,omitempty"`
}

// Catalog is where the region catalog lives, in every region's datacenter.
func (l Layout) Catalog() string { return l.Prefix + "regions/catalog" }

// ParseCatalog decodes a catalog strictly (unknown fields are errors) and
// reports every problem at once.
func ParseCatalog(data []byte) (Catalog, error) {
	var c Catalog
	if err := strictjson.Unmarshal(data, &c); err != nil {
		return Catalog{}, fmt.Errorf("region catalog: %w", err)
	}
	var errs []error
	if len(c.Regions) == 0 {
		errs = append(errs, errors.New("region catalog: no regions"))
	}
	var seen []string
	for i, r := range c.Regions {
		switch {
		case r.Name == "":
			errs = append(errs, fmt.Errorf("region catalog: regions[%d]: name required", i))
		case slices.Contains(seen, r.Name):
			errs = append(errs, fmt.Errorf("region catalog: regions[%d]: duplicate name %q", i, r.Name))
		}
		seen = append(seen, r.Name)
		if r.Redis == "" {
			errs = append(errs, fmt.Errorf("region catalog: regions[%d] (%s): redis required", i, r.Name))
		}
		switch r.RedisMode {
		case "", "standalone", "cluster", "sentinel":
		default:
			errs = append(errs, fmt.Errorf("region catalog: regions[%d] (%s): unknown redis_mode %q (want standalone, cluster or sentinel)", i, r.Name, r.RedisMode))
		}
		for _, from := range slices.Sorted(maps.Keys(r.Dial)) {
			for _, a := range []string{from, r.Dial[from]} {
				if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
					errs = append(errs, fmt.Errorf("region catalog: regions[%d] (%s): dial %q → %q: %q is not host:port", i, r.Name, from, r.Dial[from], a))
				}
			}
		}
	}
	return c, errors.Join(errs...)
}

// Names lists the catalog's region names.
func (c Catalog) Names() []string {
	out := make([]string, len(c.Regions))
	for i, r := range c.Regions {
		out[i] = r.Name
	}
	return out
}

// WatchCatalog calls fn with the local datacenter's catalog document (nil
// when absent) now and after every change.
func (c *Client) WatchCatalog(ctx context.Context, fn func([]byte), onErr func(error)) {
	c.watchKey(ctx, c.layout.Catalog(), fn, onErr)
}

// PutCatalog stores the catalog in region's datacenter (once per region:
// every region keeps its own copy).
func (c *Client) PutCatalog(ctx context.Context, region string, cat Catalog) error {
	data, err := json.Marshal(cat)
	if err != nil {
		return fmt.Errorf("encoding region catalog: %w", err)
	}
	if _, err := ParseCatalog(data); err != nil {
		return err
	}
	_, err = c.api.KV().Put(&api.KVPair{Key: c.layout.Catalog(), Value: data}, (&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	return classifyIn(region, "writing the region catalog in "+region, err)
}
