package region

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostsKey(t *testing.T) {
	require.Equal(t, "edgeguard/hosts/eu-west", NewLayout("").Hosts("eu-west"))
	require.Equal(t, "p/hosts/eu-west", NewLayout("p/").Hosts("eu-west"))
}

// A host table pushed with its history entry is read back with its index,
// watched (with its index, not the neighbouring region's), and history
// lists it under KindHosts.
func TestHostsPushReadWatch(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	doc, index, err := rc.Hosts(ctx, "eu-west")
	require.NoError(t, err)
	require.Nil(t, doc)
	require.Zero(t, index)

	type seen struct {
		doc   string
		index uint64
	}
	got := make(chan seen, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.WatchHosts(ctx, "eu-west", func(d []byte, i uint64) { got <- seen{string(d), i} }, nil)
	}()
	next := func() seen {
		select {
		case v := <-got:
			return v
		case <-time.After(10 * time.Second):
			t.Fatal("no value from the watch")
			return seen{}
		}
	}
	require.Equal(t, seen{}, next())

	key := rc.Layout().Hosts("eu-west")
	// A host table is stored whole (the edge reads it in one query), up
	// to its size limit (128 KiB, internal/hosts), which leaves room in
	// Consul's 512 KiB transaction for the history entry holding it too,
	// even with every line's quotes escaped in the entry's JSON.
	line := []byte("  \"h0000.example.com\": {pool: \"default\"}\n")
	big := append([]byte("version: 1\nhosts:\n"), bytes.Repeat(line, (128<<10)/len(line))...)
	_, err = rc.Push(ctx, "eu-west", rc.Layout().Hosts("eu-west-2"), big, 0, Entry{Kind: KindHosts, Version: "v0"})
	require.NoError(t, err)
	pair, _, err := rc.API().KV().Get(rc.Layout().Hosts("eu-west-2"), nil)
	require.NoError(t, err)
	require.Equal(t, big, pair.Value, "stored whole, not as a manifest")

	v1 := []byte("version: 1\nhosts:\n  a.example.com: {pool: default}\n")
	_, err = rc.Push(ctx, "eu-west", key, v1, 0, Entry{Kind: KindHosts, Version: "v1", Author: "t"})
	require.NoError(t, err)
	doc, index, err = rc.Hosts(ctx, "eu-west")
	require.NoError(t, err)
	require.Equal(t, v1, doc)
	require.NotZero(t, index)
	require.Equal(t, seen{string(v1), index}, next(), "eu-west-2's table is not eu-west's")

	// Check-and-set: a push on a stale index is a conflict, and writes no
	// history.
	_, err = rc.Push(ctx, "eu-west", key, []byte("version: 1\n"), 0, Entry{Kind: KindHosts, Version: "v2"})
	require.ErrorIs(t, err, ErrConflict)
	hist, err := rc.History(ctx, "eu-west", KindHosts)
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, "v1", hist[0].Version)
	require.Equal(t, key, hist[0].Key)
	require.Equal(t, string(v1), hist[0].Document)

	_, err = rc.API().KV().Delete(key, nil)
	require.NoError(t, err)
	require.Equal(t, seen{}, next())
	cancel()
	<-done
}
