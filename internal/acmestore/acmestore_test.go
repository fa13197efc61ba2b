package acmestore

import (
	"context"
	"io/fs"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestStorageOverConsul(t *testing.T) {
	consul, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer consul.Close()
	client, err := consul.Client("")
	require.NoError(t, err)
	s := New(client, "edgeguard/acme/eu-west")
	ctx := context.Background()

	_, err = s.Load(ctx, "certificates/ca/a.example/a.example.crt")
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.False(t, s.Exists(ctx, "certificates"))

	before := time.Now().Add(-time.Second)
	for _, k := range []string{"certificates/ca/a.example/a.example.crt", "certificates/ca/a.example/a.example.key", "certificates/ca/b.example/b.example.crt", "acme/ca/users/x/x.json"} {
		require.NoError(t, s.Store(ctx, k, []byte("v:"+k)))
	}
	v, err := s.Load(ctx, "certificates/ca/a.example/a.example.key")
	require.NoError(t, err)
	require.Equal(t, "v:certificates/ca/a.example/a.example.key", string(v))

	info, err := s.Stat(ctx, "certificates/ca/a.example/a.example.crt")
	require.NoError(t, err)
	require.True(t, info.IsTerminal)
	require.False(t, info.Modified.Before(before.Truncate(time.Second)))
	info, err = s.Stat(ctx, "certificates/ca")
	require.NoError(t, err)
	require.False(t, info.IsTerminal)

	list, err := s.List(ctx, "certificates/ca", false)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"certificates/ca/a.example", "certificates/ca/b.example"}, list)
	list, err = s.List(ctx, "certificates", true)
	require.NoError(t, err)
	require.Len(t, list, 3)

	require.NoError(t, s.Delete(ctx, "certificates/ca/a.example"))
	require.False(t, s.Exists(ctx, "certificates/ca/a.example/a.example.crt"))
	require.True(t, s.Exists(ctx, "certificates/ca/b.example/b.example.crt"))
	require.ErrorIs(t, s.Delete(ctx, "certificates/ca/a.example"), fs.ErrNotExist)

	// A lock is held by one storage (one edge) at a time.
	other := New(client, "edgeguard/acme/eu-west")
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, st := range []*Storage{s, other, New(client, "edgeguard/acme/eu-west"), New(client, "edgeguard/acme/eu-west")} {
		wg.Go(func() {
			if err := st.Lock(ctx, "issue_cert_a.example"); err != nil {
				errs <- err
				return
			}
			n := holders.Add(1)
			if n > most.Load() {
				most.Store(n)
			}
			time.Sleep(50 * time.Millisecond) // kept: a hold the others' attempts overlap; their Lock has no hook to wait on
			holders.Add(-1)
			errs <- st.Unlock(ctx, "issue_cert_a.example")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), most.Load())

	// A lock waited for gives up with its context.
	require.NoError(t, s.Lock(ctx, "held"))
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, other.Lock(wctx, "held"), context.DeadlineExceeded)
	require.NoError(t, s.Unlock(ctx, "held"))
	require.NoError(t, other.Lock(ctx, "held"))
	require.NoError(t, other.Unlock(ctx, "held"))
}
