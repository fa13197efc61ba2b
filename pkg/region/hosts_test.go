package region

import (
	"bytes"
	"context"
	"fmt"
	"strings"
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
	// A host table of 128 KiB is stored whole (under InlineMax), which
	// leaves room in Consul's 512 KiB transaction for the history entry
	// holding it too, even with every line's quotes escaped in the entry's
	// JSON.
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

// largeHosts is a host table over InlineMax, told apart by tag.
func largeHosts(tag string) []byte {
	var b strings.Builder
	b.WriteString("version: 1\nhosts:\n")
	for i := 0; b.Len() <= InlineMax+PartSize/2; i++ {
		fmt.Fprintf(&b, "  %s-%06d.example.com: {pool: default}\n", tag, i)
	}
	return []byte(b.String())
}

// A host table over InlineMax is stored in parts, and read whole by Hosts
// and by the watch, with the key's index. Collecting parts keeps the parts
// the hosts key names even once no history entry names them (pruned): a
// collection that looked at the rules alone deleted a live table's parts.
func TestHostsInParts(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := rc.Layout().Hosts("eu-west")
	big := largeHosts("a")

	got := make(chan []byte, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.WatchHosts(ctx, "eu-west", func(d []byte, _ uint64) { got <- d }, nil)
	}()
	next := func() []byte {
		select {
		case v := <-got:
			return v
		case <-ctx.Done():
			t.Fatal("no value from the watch")
			return nil
		}
	}
	require.Nil(t, next())

	_, err := rc.Push(ctx, "eu-west", key, big, 0, Entry{Kind: KindHosts, Version: "a"})
	require.NoError(t, err)
	pair, _, err := rc.API().KV().Get(key, nil)
	require.NoError(t, err)
	m, err := ParseManifest(pair.Value)
	require.NoError(t, err)
	require.NotNil(t, m, "stored in parts")
	require.Len(t, m.Parts, 2)

	doc, index, err := rc.Hosts(ctx, "eu-west")
	require.NoError(t, err)
	require.Equal(t, big, doc)
	require.Equal(t, pair.ModifyIndex, index)
	require.Equal(t, big, next(), "the watch reads the parts")

	// History pruned away: the hosts key alone names the parts.
	_, err = rc.API().KV().DeleteTree(rc.Layout().History("eu-west"), nil)
	require.NoError(t, err)
	n, err := rc.CollectParts(ctx, "eu-west")
	require.NoError(t, err)
	require.Zero(t, n, "the live table's parts are kept")
	doc, _, err = rc.Hosts(ctx, "eu-west")
	require.NoError(t, err)
	require.Equal(t, big, doc)

	// Once the table is replaced, its parts are the unnamed ones.
	small := []byte("version: 1\n")
	_, err = rc.Push(ctx, "eu-west", key, small, index, Entry{Kind: KindHosts, Version: "b"})
	require.NoError(t, err)
	require.Equal(t, small, next())
	n, err = rc.CollectParts(ctx, "eu-west")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	// A part gone missing (deleted by hand): Hosts says so, the watch
	// passes nothing and tries again.
	_, err = rc.Push(ctx, "eu-west", key, big, 0, Entry{Kind: KindHosts, Version: "a"})
	require.ErrorIs(t, err, ErrConflict)
	_, index, err = rc.Hosts(ctx, "eu-west")
	require.NoError(t, err)
	_, err = rc.Push(ctx, "eu-west", key, big, index, Entry{Kind: KindHosts, Version: "a"})
	require.NoError(t, err)
	require.Equal(t, big, next())
	_, err = rc.API().KV().Delete(m.Parts[1].Key, nil)
	require.NoError(t, err)
	_, _, err = rc.Hosts(ctx, "eu-west")
	require.ErrorContains(t, err, "is missing")
	cancel()
	<-done
	select {
	case v := <-got:
		t.Fatalf("the watch passed %d bytes", len(v))
	default:
	}
}
