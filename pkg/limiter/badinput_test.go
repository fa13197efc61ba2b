package limiter_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

func TestInvalidRequestsAreRefusedOneByOne(t *testing.T) {
	good := limiter.Limit{Key: "k", Algorithm: limit.SlidingLog, Limit: 5, Window: time.Second}
	with := func(f func(*limiter.Limit)) limiter.Limit { l := good; f(&l); return l }
	cases := []struct {
		name string
		req  limiter.Request
		want error
		text string
	}{
		{"zero limit", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Limit = 0 }), Cost: 1}, limiter.ErrInvalidLimit, "limit: must be"},
		{"negative limit", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Limit = -3 }), Cost: 1}, limiter.ErrInvalidLimit, "limit: must be"},
		{"zero window", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Window = 0 }), Cost: 1}, limiter.ErrInvalidLimit, "window"},
		{"negative window", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Window = -time.Second }), Cost: 1}, limiter.ErrInvalidLimit, "window"},
		{"unknown algorithm", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Algorithm = 42 }), Cost: 1}, limiter.ErrUnknownAlgorithm, "algorithm(42)"},
		{"empty key", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Key = "" }), Cost: 1}, limiter.ErrInvalidLimit, "key is empty"},
		{"brace in key", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Key = "a{b}" }), Cost: 1}, limiter.ErrInvalidLimit, "brace"},
		{"opening brace in key", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Key = "a{b" }), Cost: 1}, limiter.ErrInvalidLimit, "brace"},
		{"closing brace in key", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Key = "a}b" }), Cost: 1}, limiter.ErrInvalidLimit, "brace"},
		{"burst on sliding log", limiter.Request{Limit: with(func(l *limiter.Limit) { l.Burst = 3 }), Cost: 1}, limiter.ErrInvalidLimit, "burst"},
		{"min interval not below window", limiter.Request{Limit: with(func(l *limiter.Limit) { l.MinInterval = time.Second }), Cost: 1}, limiter.ErrInvalidLimit, "min_interval"},
		{"zero cost", limiter.Request{Limit: good, Cost: 0}, limiter.ErrInvalidRequest, "cost"},
		{"negative cost", limiter.Request{Limit: good, Cost: -1}, limiter.ErrInvalidRequest, "cost"},
		{"negative need", limiter.Request{Limit: good, Cost: 1, Need: -1}, limiter.ErrInvalidRequest, "need"},
		{"sliding window product", limiter.Request{Limit: limiter.Limit{Key: "k", Algorithm: limit.SlidingWindow, Limit: 1e9, Window: 24 * time.Hour}, Cost: 1}, limiter.ErrInvalidLimit, "2^53"},
	}
	stores := []namedStore{{"memory", limiter.NewMemoryStore()}, {"redis", redisStore(t, client(limiter.ModeStandalone))}}
	for _, st := range stores {
		for _, c := range cases {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				ok := limiter.Request{Limit: with(func(l *limiter.Limit) { l.Key = testenv.KeyPrefix(t) }), Cost: 1}
				ds, err := st.store.Take(ctx(t), []limiter.Request{c.req, ok})
				require.ErrorIs(t, err, c.want)
				require.ErrorContains(t, err, c.text)
				var te *limiter.TakeError
				require.True(t, errors.As(err, &te))
				require.Error(t, te.Errs[0])
				require.NoError(t, te.Errs[1], "the valid request beside it is still decided")
				require.True(t, ds[1].Allowed)
			})
		}
	}
}

func TestParseMode(t *testing.T) {
	m, err := limiter.ParseMode("")
	require.NoError(t, err)
	require.Equal(t, limiter.ModeStandalone, m)
	_, err = limiter.ParseMode("replicated")
	require.ErrorContains(t, err, "unknown redis mode")
}

func TestMalformedRedisURLs(t *testing.T) {
	cases := []struct {
		url  string
		mode limiter.Mode
		text string
	}{
		{"", limiter.ModeStandalone, "empty URL"},
		{"http://127.0.0.1:6379", limiter.ModeStandalone, "invalid URL scheme"},
		{"redis://127.0.0.1:notaport", limiter.ModeStandalone, "parsing redis URL"},
		{"redis://127.0.0.1:6379?bogus=1", limiter.ModeStandalone, "bogus"},
		{"redis://127.0.0.1:6379/x", limiter.ModeStandalone, "database number"},
		{"redis://127.0.0.1:7000?read_timeout=soon", limiter.ModeCluster, "read_timeout"},
		{"ftp://127.0.0.1:7000", limiter.ModeCluster, "invalid URL scheme"},
		{"redis://127.0.0.1:26379", limiter.ModeSentinel, "master_name is required"},
		{"redis://127.0.0.1:6379", limiter.Mode("raft"), "unknown redis mode"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			_, err := limiter.NewRedisClient(c.url, c.mode)
			require.ErrorContains(t, err, c.text)
		})
	}
	_, err := limiter.NewRedisStore(limiter.Conn(client(limiter.ModeStandalone)), "bad{prefix")
	require.ErrorContains(t, err, "brace")
}

// A Redis that is down, one that never answers, and a wrong password: every
// call returns an error (the caller falls back), within the caller's deadline.
func TestUnavailableRedis(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	// Reserved, so a server started meanwhile (this test's own below) cannot
	// take the port: a port found free and closed once did, and "down"
	// reached a Redis asking for a password.
	closedAddr := testenv.ClosedAddr(t)

	locked, err := testenv.StartStandalone(testenv.StandaloneOptions{Password: "right"})
	require.NoError(t, err)
	defer locked.Close()

	cases := []struct {
		name, url string
		text      string
	}{
		{"down", "redis://" + closedAddr, "connection refused"},
		{"silent", "redis://" + silent.Addr().String(), "(timeout|deadline exceeded)"},
		{"wrong password", "redis://:wrong@" + locked.Addr, "WRONGPASS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, err := limiter.NewRedisClient(c.url, limiter.ModeStandalone)
			require.NoError(t, err, "building a client never dials: an edge starts while Redis is down")
			defer client.Close()
			st := redisStore(t, client)
			cx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			l := limiter.Limit{Key: "k", Algorithm: limit.FixedWindow, Limit: 5, Window: time.Second}
			start := time.Now()
			_, err = st.Take(cx, []limiter.Request{{Limit: l, Cost: 1}})
			require.Error(t, err)
			require.Regexp(t, c.text, err.Error())
			// The deadline is honoured, not go-redis's 3 s ReadTimeout.
			require.Less(t, time.Since(start), 2*time.Second)
			lim, err := limiter.New(st, limiter.Config{Timeout: 100 * time.Millisecond, FailMode: limiter.FailClosed}, nil, nil)
			require.NoError(t, err)
			_, err = lim.Decide(cx, []limiter.Check{{Limit: l, Cost: 1}})
			require.ErrorIs(t, err, limiter.ErrUnavailable)
		})
	}
}
