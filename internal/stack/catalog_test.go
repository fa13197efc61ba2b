package stack

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/region"
)

func TestRegionCatalog(t *testing.T) {
	edge := func(name, reg, redis, mode, salt string) Spec {
		return Spec{Kind: KindEdge, Edge: &EdgeSpec{Name: name, Region: reg, Redis: redis, RedisMode: mode, KeySalt: salt}}
	}
	const salt = "edgeguard-stack-key-salt"
	eu := "redis://127.0.0.1:7101?addr=127.0.0.1:7102"
	us := "redis://127.0.0.1:26389?addr=127.0.0.1:26390&master_name=us-east-master"
	t.Run("one entry per region, in name order", func(t *testing.T) {
		cat, err := regionCatalog([]Spec{
			edge("us-east-iad-1", "us-east", us, "sentinel", salt),
			edge("eu-west-ams-1", "eu-west", eu, "cluster", salt),
			edge("eu-west-fra-1", "eu-west", eu, "cluster", salt),
		})
		require.NoError(t, err)
		require.Equal(t, region.Catalog{Regions: []region.CatalogRegion{
			{Name: "eu-west", Redis: eu, RedisMode: "cluster"},
			{Name: "us-east", Redis: us, RedisMode: "sentinel"},
		}}, cat)
	})
	t.Run("edges of a region disagree on its Redis", func(t *testing.T) {
		_, err := regionCatalog([]Spec{
			edge("eu-west-ams-1", "eu-west", eu, "cluster", salt),
			edge("eu-west-fra-1", "eu-west", us, "sentinel", salt),
		})
		require.ErrorContains(t, err, "different Redis")
	})
	t.Run("a salt per region", func(t *testing.T) {
		_, err := regionCatalog([]Spec{
			edge("eu-west-ams-1", "eu-west", eu, "cluster", salt),
			edge("us-east-iad-1", "us-east", us, "sentinel", salt+"-us"),
		})
		require.ErrorContains(t, err, "key salts")
	})
}
