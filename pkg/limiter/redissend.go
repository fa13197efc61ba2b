package limiter

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// The store's Redis concerns, in one place: every script command it sends
// goes through process or pipelineOn, which count what is sent
// (Sent) and read a Cluster's slot map again after a connection error;
// scripts are hashed once (newScript), and a command that met NOSCRIPT is
// sent again after the scripts are loaded by one function (againAfterLoad).

// script is a Lua script sent by its hash (EVALSHA), with its source to
// load it again (SCRIPT LOAD), as go-redis's Script keeps both: the hash is
// computed once, when the script is made.
type script struct{ src, sha string }

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(sum[:])}
}

// load loads sc on every node and checks that Redis hashes it as sc does.
func (sc script) load(ctx context.Context, c RedisClient, name string) error {
	sha, err := c.ScriptLoad(ctx, sc.src).Result()
	if err != nil {
		return fmt.Errorf("loading %s script: %w", name, err)
	}
	if sha != sc.sha {
		return fmt.Errorf("loading %s script: redis returned sha %s, want %s", name, sha, sc.sha)
	}
	return nil
}

// once marks a script call that go-redis must not send again after a
// connection error: the call may have run, and a second run would count it
// twice. go-redis's Cluster client retries such errors by itself (up to
// MaxRedirects, whatever MaxRetries says); MOVED and ASK are still
// followed, since a redirected call did not run. The caller sees the error
// and its fallback decides.
type once struct{ *redis.Cmd }

func (once) NoRetry() bool { return true }

// evalShaCmd is an EVALSHA command of sc, routed by its first key.
func evalShaCmd(ctx context.Context, sc script, keys []string, argv []any) *redis.Cmd {
	args := make([]any, 0, 3+len(keys)+len(argv))
	args = append(args, "evalsha", sc.sha, len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	cmd := redis.NewCmd(ctx, append(args, argv...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// failedCmd is a command that failed with err without being sent.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// process sends one script command carrying calls script calls on client.
func (s *RedisStore) process(ctx context.Context, client RedisClient, cmd *redis.Cmd, calls int) {
	s.sent.add(1, calls)
	if client.Process(ctx, once{cmd}) != nil {
		s.maybeReload([]*redis.Cmd{cmd})
	}
}

// pipeline sends cmds in one pipeline (one round trip per node); counted
// of them are the store's script calls (the others are riders).
func (s *RedisStore) pipeline(ctx context.Context, cmds []*redis.Cmd, counted int) error {
	return s.pipelineOn(ctx, s.client, cmds, counted, counted)
}

// pipelineOn sends cmds in one pipeline on client; they count as commands
// script commands carrying calls script calls (the others are riders).
// Per-command errors are read from each command. A connection that fails
// before the pipeline is written (a wrong password fails the handshake)
// leaves its commands without reply or error: they get Exec's error.
func (s *RedisStore) pipelineOn(ctx context.Context, client RedisClient, cmds []*redis.Cmd, commands, calls int) error {
	pipe := client.Pipeline()
	for _, cmd := range cmds {
		_ = pipe.Process(ctx, once{cmd})
	}
	s.sent.add(commands, calls)
	_, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	for _, cmd := range cmds {
		if cmd.Err() == nil && cmd.Val() == nil {
			cmd.SetErr(err)
		}
	}
	s.maybeReload(cmds)
	return err
}

// againAfterLoad sends cmds with send(all) and, when any of them met
// NOSCRIPT, loads the scripts and sends those only again: script caches
// vanish when a node restarts or fails over, and a command that met
// NOSCRIPT ran nothing, while the others have counted (go-redis's
// Script.Run falls back from EVALSHA the same way). send fills cmds at the
// indexes want accepts; fail is told the error of each command still
// without its script.
func (s *RedisStore) againAfterLoad(ctx context.Context, cmds []*redis.Cmd, send func(want func(int) bool), fail func(i int, err error)) {
	send(every)
	if !slices.ContainsFunc(cmds, metNoScript) {
		return
	}
	retry := make([]bool, len(cmds)) // made here only: cmds stays on its caller's stack
	for i, cmd := range cmds {
		retry[i] = metNoScript(cmd)
	}
	if err := s.Load(ctx); err != nil {
		for i := range cmds {
			if retry[i] {
				fail(i, fmt.Errorf("%w: %w", ErrNoScript, err))
			}
		}
		return
	}
	send(func(i int) bool { return retry[i] })
	for i, cmd := range cmds {
		if retry[i] && metNoScript(cmd) {
			fail(i, fmt.Errorf("%w after reload: %w", ErrNoScript, cmd.Err()))
		}
	}
}

// maybeReload asks a Cluster for its slot map again after a connection
// error (go-redis coalesces the requests); see RedisConn.Reload.
func (s *RedisStore) maybeReload(cmds []*redis.Cmd) {
	if s.conn.Reload == nil {
		return
	}
	for _, c := range cmds {
		if c == nil || c.Err() == nil {
			continue
		}
		var rerr redis.Error
		if !errors.As(c.Err(), &rerr) {
			s.conn.Reload(context.Background())
			return
		}
	}
}

func every(int) bool { return true }

func metNoScript(cmd *redis.Cmd) bool { return cmd != nil && isNoScript(cmd.Err()) }

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
