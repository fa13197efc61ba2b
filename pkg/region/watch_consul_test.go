package region

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func testClient(t *testing.T) *Client {
	t.Helper()
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	cfg := api.DefaultConfig()
	cfg.Address = c.HTTPAddr()
	rc, err := NewClient(cfg, "")
	require.NoError(t, err)
	return rc
}

// A panic in a watch (here the caller's function) is recovered and
// reported, and the watch goes on: the next change is delivered.
func TestWatchRecoversPanic(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := rc.Layout().Shedder("eu-west")
	errs := make(chan error, 16)
	got := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.WatchShedder(ctx, "eu-west", func(v []byte) {
			if string(v) == "boom" {
				panic("boom")
			}
			got <- string(v)
		}, func(err error) { errs <- err })
	}()
	require.Equal(t, "", <-got)
	_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte("boom")}, nil)
	require.NoError(t, err)
	select {
	case err := <-errs:
		var p *PanicError
		require.True(t, errors.As(err, &p), "%v", err)
		require.Equal(t, "boom", p.Value)
		require.NotEmpty(t, p.Stack)
	case <-time.After(10 * time.Second):
		t.Fatal("the panic was not reported")
	}
	_, err = rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(`{"good": 0.6}`)}, nil)
	require.NoError(t, err)
	select {
	case v := <-got:
		require.Equal(t, `{"good": 0.6}`, v)
	case <-time.After(15 * time.Second):
		t.Fatal("the watch stopped after the panic")
	}
	cancel()
	<-done
}

// A manifest that cannot name a document is refused once, as it stands
// (not retried), and the watch goes on.
func TestWatchRefusesBadManifest(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 16)
	got := make(chan Docs, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.WatchRules(ctx, "eu-west", func(d Docs) { got <- d }, func(err error) { errs <- err })
	}()
	<-got
	_, err := rc.API().KV().Put(&api.KVPair{Key: rc.Layout().GlobalRules(), Value: []byte(
		`{"kind":"edgeguard-rules-parts/v1","version":"x","size": -1,"sha256":"","parts":[{"key":"edgeguard/parts/x","size":10,"sha256":"x"}]}`)}, nil)
	require.NoError(t, err)
	select {
	case err := <-errs:
		var refused *RefusedError
		require.True(t, errors.As(err, &refused), "%v", err)
		require.ErrorIs(t, err, ErrInvalidManifest)
	case <-time.After(10 * time.Second):
		t.Fatal("the bad manifest was not reported")
	}
	good := "version: 1\nrules: []\n"
	_, err = rc.API().KV().Put(&api.KVPair{Key: rc.Layout().GlobalRules(), Value: []byte(good)}, nil)
	require.NoError(t, err)
	select {
	case d := <-got:
		require.Equal(t, good, string(d.Global))
	case <-time.After(10 * time.Second):
		t.Fatal("the watch stopped after the bad manifest")
	}
	require.Empty(t, errs, "refused once, not retried")
	cancel()
	<-done
}
