// Package acmestore keeps certmagic's ACME state (account, certificates,
// keys, challenge tokens, locks) in Consul KV under one prefix, so a
// region's edges share it: one edge obtains or renews a certificate while
// the others wait on its lock and then load the result, and any edge can
// answer a challenge another one started (certmagic's distributed
// solving reads the token from the storage).
//
// Keys map one to one under the prefix. Consul has no modification time,
// so Store puts the Unix time in the pair's flags and Stat reads it back.
// Locks are Consul locks (a session with a TTL on <prefix>locks/<name>): a
// lock held by an edge that died is released when its session expires.
package acmestore

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/hashicorp/consul/api"
)

// Storage is a certmagic.Storage over Consul KV.
type Storage struct {
	kv     *api.KV
	client *api.Client
	prefix string // ends in "/"

	mu    sync.Mutex
	locks map[string]*api.Lock
}

var _ certmagic.Storage = (*Storage)(nil)

// New keeps the state under prefix ("edgeguard/acme/eu-west/").
func New(client *api.Client, prefix string) *Storage {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Storage{kv: client.KV(), client: client, prefix: prefix, locks: map[string]*api.Lock{}}
}

// lockTTL bounds how long a dead edge's lock outlives it.
const lockTTL = "30s"

func (s *Storage) key(k string) string { return s.prefix + strings.TrimPrefix(k, "/") }

// Lock takes the named lock, waiting until it is free or ctx is done.
func (s *Storage) Lock(ctx context.Context, name string) error {
	l, err := s.client.LockOpts(&api.LockOptions{
		Key:          s.prefix + "locks/" + name,
		SessionName:  "edgeguard-acme",
		SessionTTL:   lockTTL,
		LockWaitTime: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("locking %s: %w", name, err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			close(stop)
		case <-done:
		}
	}()
	defer close(done)
	for {
		lost, err := l.Lock(stop)
		switch {
		case err != nil:
			return fmt.Errorf("locking %s: %w", name, err)
		case lost != nil:
			s.mu.Lock()
			s.locks[name] = l
			s.mu.Unlock()
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		// LockWaitTime passed without the lock: wait again.
	}
}

// Unlock releases a lock this storage holds.
func (s *Storage) Unlock(_ context.Context, name string) error {
	s.mu.Lock()
	l := s.locks[name]
	delete(s.locks, name)
	s.mu.Unlock()
	if l == nil {
		return fmt.Errorf("unlocking %s: not held", name)
	}
	if err := l.Unlock(); err != nil {
		return fmt.Errorf("unlocking %s: %w", name, err)
	}
	_ = l.Destroy() // the lock key goes once nobody waits on it
	return nil
}

// Store writes value at key.
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	_, err := s.kv.Put(&api.KVPair{Key: s.key(key), Value: value, Flags: uint64(time.Now().Unix())}, (&api.WriteOptions{}).WithContext(ctx))
	return err
}

// Load reads key; fs.ErrNotExist when absent.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	p, _, err := s.kv.Get(s.key(key), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fs.ErrNotExist
	}
	return p.Value, nil
}

// Delete removes key and everything under it; fs.ErrNotExist when there
// was nothing.
func (s *Storage) Delete(ctx context.Context, key string) error {
	if !s.Exists(ctx, key) {
		return fs.ErrNotExist
	}
	k := s.key(key)
	wo := (&api.WriteOptions{}).WithContext(ctx)
	if _, err := s.kv.Delete(k, wo); err != nil {
		return err
	}
	_, err := s.kv.DeleteTree(k+"/", wo)
	return err
}

// Exists reports whether key is a value or a directory.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// List lists the keys under path (full keys, as given to Store), only its
// direct children unless recursive.
func (s *Storage) List(ctx context.Context, path string, recursive bool) ([]string, error) {
	dir := s.key(path)
	if !strings.HasSuffix(dir, "/") {
		dir += "/"
	}
	sep := "/"
	if recursive {
		sep = ""
	}
	keys, _, err := s.kv.Keys(dir, sep, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, fs.ErrNotExist
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(k, s.prefix), "/"))
	}
	return out, nil
}

// Stat describes key: a value (terminal) or a directory.
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	q := (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
	p, _, err := s.kv.Get(s.key(key), q)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	if p != nil {
		return certmagic.KeyInfo{Key: key, Modified: time.Unix(int64(p.Flags), 0), Size: int64(len(p.Value)), IsTerminal: true}, nil
	}
	keys, _, err := s.kv.Keys(s.key(key)+"/", "/", q)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	if len(keys) == 0 {
		return certmagic.KeyInfo{}, fs.ErrNotExist
	}
	return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
}

// String names the storage in certmagic's logs and lock keys.
func (s *Storage) String() string { return "consul:" + s.prefix }
