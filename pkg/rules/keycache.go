package rules

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"
)

// keyCache holds the keys a snapshot made last. A client flooding a rule
// asks for the same key request after request, and making it (SHA-256
// over the salted descriptor values, then base64) is most of what matching
// costs; a key found here costs a maphash and a comparison, and no
// allocation. Each slot holds the last key made into it: a lookup that
// finds another rule's or another input's key there makes the key as
// before and takes the slot. Entries never change once stored, so readers
// need no lock.
type keyCache struct {
	seed  maphash.Seed
	slots [keyCacheSlots]atomic.Pointer[cachedKey]
}

// keyCacheSlots bounds the memory of a snapshot's cache: 8 KiB of slots
// and at most this many entries of about 200 bytes.
const keyCacheSlots = 1024

// maxCachedInput is the longest hash input kept: an IP key with a salt of
// up to 64 bytes and a short header value fit; longer ones are hashed on
// every request, as before.
const maxCachedInput = 160

// maxKeyLen is the longest key: the prefix ("<rule id>:") and the 22
// characters of the hash.
const maxKeyLen = maxIDLen + 1 + 22

// cachedKey is one key and what it was made from. It never changes once
// stored. The key is a string of its own, not a view of the entry: the
// limiter keeps keys (its over-limit cache, its counters), and a key must
// not hold a whole entry in memory with it.
type cachedKey struct {
	rule  *CompiledRule
	in    [maxCachedInput]byte
	inLen uint8
	key   string
}

func newKeyCache() *keyCache {
	return &keyCache{seed: maphash.MakeSeed()}
}

// slot is where r's key for input in lives.
func (c *keyCache) slot(r *CompiledRule, in []byte) *atomic.Pointer[cachedKey] {
	h := maphash.Bytes(c.seed, in)
	// The rule's address tells two rules with the same descriptors apart
	// (their inputs are equal, their prefixes not); it is only hashed.
	h ^= uint64(uintptr(unsafe.Pointer(r))) * 0x9e3779b97f4a7c15
	return &c.slots[h&(keyCacheSlots-1)]
}

// get is r's key for input in, if the slot holds it.
func (c *keyCache) get(slot *atomic.Pointer[cachedKey], r *CompiledRule, in []byte) (string, bool) {
	e := slot.Load()
	if e == nil || e.rule != r || string(e.in[:e.inLen]) != string(in) {
		return "", false
	}
	return e.key, true
}

// put stores key as r's for input in and returns it as a string (the
// caller's is a view of a stack buffer). An input too long to keep is not
// stored.
func (c *keyCache) put(slot *atomic.Pointer[cachedKey], r *CompiledRule, in, key []byte) string {
	if len(in) > maxCachedInput {
		return string(key)
	}
	e := &cachedKey{rule: r, inLen: uint8(len(in)), key: string(key)}
	copy(e.in[:], in)
	slot.Store(e)
	return e.key
}
