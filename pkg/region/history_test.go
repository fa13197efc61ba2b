package region

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// History is ordered by the order pushes landed in Consul, not by the
// pushers' clocks: a push from a host whose clock is an hour behind is
// still the newest entry, and retention keeps it.
func TestHistoryOrderIgnoresClocks(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := rc.Layout().GlobalRules()
	first, err := rc.Push(ctx, "eu-west", key, []byte("version: 1\nrules: []\n"), 0, Entry{Kind: KindGlobalRules, Version: "first"})
	require.NoError(t, err)
	_, idx, err := rc.Get(ctx, "eu-west", key)
	require.NoError(t, err)
	rc.now = func() time.Time { return time.Now().Add(-time.Hour) } // a host whose clock is behind
	second, err := rc.Push(ctx, "eu-west", key, []byte("version: 1\nrules: [] # again\n"), idx, Entry{Kind: KindGlobalRules, Version: "second"})
	require.NoError(t, err)
	require.Less(t, second.Seq, first.Seq, "the second push's clock is earlier")

	h, err := rc.History(ctx, "eu-west", "")
	require.NoError(t, err)
	require.Len(t, h, 2)
	require.Equal(t, []string{"second", "first"}, []string{h[0].Version, h[1].Version}, "newest first")

	pruned, err := rc.PruneHistory(ctx, "eu-west", 1)
	require.NoError(t, err)
	require.Len(t, pruned, 1)
	require.Equal(t, "first", pruned[0].Version, "retention deletes the older push")
	h, err = rc.History(ctx, "eu-west", "")
	require.NoError(t, err)
	require.Len(t, h, 1)
	require.Equal(t, "second", h[0].Version)
}
