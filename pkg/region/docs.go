package region

import (
	"context"

	"github.com/hashicorp/consul/api"
)

// Docs are a region's rule documents (whole, also when stored in parts),
// with their keys' ModifyIndex (0 when absent) for check-and-set.
type Docs struct {
	Global, Region           []byte
	GlobalIndex, RegionIndex uint64
	// Canary: Region is the PoP's canary document (ReadPoPDocs,
	// WatchPoPRules), not the region's.
	Canary bool
	// GlobalCanary: Global is the PoP's global canary document, not
	// rules/global.
	GlobalCanary bool
}

// ReadDocs reads a region's two rule documents from its datacenter; a
// document stored in parts is read whole.
func (c *Client) ReadDocs(ctx context.Context, region string) (Docs, error) {
	return c.ReadPoPDocs(ctx, region, "")
}

func (c *Client) docsOf(pairs api.KVPairs, region string) Docs {
	var d Docs
	for _, p := range pairs {
		switch p.Key {
		case c.layout.GlobalRules():
			d.Global, d.GlobalIndex = p.Value, p.ModifyIndex
		case c.layout.RegionRules(region):
			d.Region, d.RegionIndex = p.Value, p.ModifyIndex
		}
	}
	return d
}

// Get reads one key in a region: its value and ModifyIndex (0, nil when absent).
func (c *Client) Get(ctx context.Context, region, key string) ([]byte, uint64, error) {
	p, _, err := c.api.KV().Get(key, (&api.QueryOptions{Datacenter: region, RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, 0, classifyIn(region, "reading "+key+" in "+region, err)
	}
	if p == nil {
		return nil, 0, nil
	}
	return p.Value, p.ModifyIndex, nil
}
