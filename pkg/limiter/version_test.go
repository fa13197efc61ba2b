package limiter

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// infoClient answers INFO server with a given text; nothing else is used.
type infoClient struct {
	RedisClient
	info string
}

func (c infoClient) Process(_ context.Context, cmd redis.Cmder) error {
	cmd.(*redis.StringCmd).SetVal(c.info)
	return nil
}

// The scripts need Redis 7 (script flags): an older server is named at
// load, before any script is sent, instead of every multi-limit decision
// quietly going to the fallback.
func TestRedisVersionChecked(t *testing.T) {
	for _, c := range []struct {
		info string
		err  bool
	}{
		{"# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n", true},
		{"# Server\r\nredis_version:7.0.15\r\n", false},
		{"# Server\r\nredis_version:8.2.1\r\n", false},
		{"# Server\r\nno version here\r\n", false},
	} {
		err := checkVersion(context.Background(), infoClient{info: c.info})
		if c.err {
			require.ErrorIs(t, err, ErrRedisTooOld, c.info)
			require.ErrorContains(t, err, "the server runs 6.2.14")
		} else {
			require.NoError(t, err, c.info)
		}
	}
	st, err := NewRedisStore(RedisConn{Client: infoClient{info: "redis_version:6.0.20\r\n"}}, "")
	require.NoError(t, err)
	require.ErrorIs(t, st.Load(context.Background()), ErrRedisTooOld, "Load checks before it sends a script")
}
