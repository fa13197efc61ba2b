package region

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// The region's TLS session-ticket keys, shared by its edges so a client
// resumes its session on any of them:
//
//	ticket-keys/<region>      {"keys": ["<64 hex digits>", …], "rotated": "<RFC 3339>"}
//
// The first key encrypts new tickets, every key decrypts. A rotation puts
// a fresh key first and keeps the previous ones (TicketKeysKept in all), so
// tickets issued before it still resume. The value is a secret: whoever
// reads it can decrypt recorded sessions' tickets; grant key:read on it to
// the edges only.
func (l Layout) TicketKeys(region string) string { return l.Prefix + "ticket-keys/" + region }

// TicketKeysKept is how many keys a rotation keeps: the new one and the
// previous ones, which still decrypt.
const TicketKeysKept = 3

// TicketKeys is the stored document.
type TicketKeys struct {
	Keys    [][32]byte
	Rotated time.Time
}

type ticketKeysJSON struct {
	Keys    []string  `json:"keys"`
	Rotated time.Time `json:"rotated"`
}

// MarshalJSON writes the keys as hex.
func (t TicketKeys) MarshalJSON() ([]byte, error) {
	j := ticketKeysJSON{Rotated: t.Rotated.UTC()}
	for _, k := range t.Keys {
		j.Keys = append(j.Keys, hex.EncodeToString(k[:]))
	}
	return json.Marshal(j)
}

// ParseTicketKeys reads a stored document, refusing one without a valid
// key.
func ParseTicketKeys(data []byte) (TicketKeys, error) {
	var j ticketKeysJSON
	if err := strictjson.Unmarshal(data, &j); err != nil {
		return TicketKeys{}, fmt.Errorf("session ticket keys: %w", err)
	}
	if len(j.Keys) == 0 {
		return TicketKeys{}, errors.New("session ticket keys: no key")
	}
	t := TicketKeys{Rotated: j.Rotated}
	for i, s := range j.Keys {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) != 32 {
			return TicketKeys{}, fmt.Errorf("session ticket keys: key %d: 64 hex digits (32 bytes) expected", i+1)
		}
		var k [32]byte
		copy(k[:], b)
		t.Keys = append(t.Keys, k)
	}
	return t, nil
}

// Rotate returns the keys after a rotation at now: a fresh random key
// first, then the newest of the previous ones, TicketKeysKept in all.
func (t TicketKeys) Rotate(now time.Time) TicketKeys {
	var k [32]byte
	_, _ = rand.Read(k[:]) // never fails (crypto/rand)
	keys := append([][32]byte{k}, t.Keys...)
	if len(keys) > TicketKeysKept {
		keys = keys[:TicketKeysKept]
	}
	return TicketKeys{Keys: keys, Rotated: now}
}

// ReadTicketKeys reads the region's keys and their ModifyIndex (0 when
// there are none yet; the document is then the zero TicketKeys).
func (c *Client) ReadTicketKeys(ctx context.Context, region string) (TicketKeys, uint64, error) {
	data, index, err := c.Get(ctx, region, c.layout.TicketKeys(region))
	if err != nil || index == 0 {
		return TicketKeys{}, index, err
	}
	t, err := ParseTicketKeys(data)
	return t, index, err
}

// RotateTicketKeys rotates the region's keys if the last rotation is at
// least every ago (or there are none), with a check-and-set on the value
// read: of edges racing for one rotation, one writes and the others find it
// done. It reports whether this call rotated.
func (c *Client) RotateTicketKeys(ctx context.Context, region string, every time.Duration, now time.Time) (bool, error) {
	key := c.layout.TicketKeys(region)
	t, index, err := c.ReadTicketKeys(ctx, region)
	if err != nil && index == 0 {
		return false, err
	}
	// An unreadable document is replaced: the edges refuse it anyway.
	if err == nil && index != 0 && now.Sub(t.Rotated) < every {
		return false, nil
	}
	data, err := json.Marshal(t.Rotate(now))
	if err != nil {
		return false, err
	}
	ok, _, err := c.api.KV().CAS(&api.KVPair{Key: key, Value: data, ModifyIndex: index}, (&api.WriteOptions{Datacenter: region}).WithContext(ctx))
	if err != nil {
		return false, classifyIn(region, "rotating "+key, err)
	}
	return ok, nil
}

// WatchTicketKeys calls fn with the region's keys document (nil when
// absent) now and after every change, like WatchShedder.
func (c *Client) WatchTicketKeys(ctx context.Context, region string, fn func([]byte), onErr func(error)) {
	key := c.layout.TicketKeys(region)
	var last []byte
	first := true
	c.watch(ctx, key, onErr, func(pairs api.KVPairs) error {
		var v []byte
		for _, p := range pairs {
			if p.Key == key {
				v = p.Value
			}
		}
		if !first && bytes.Equal(v, last) {
			return nil
		}
		first, last = false, v
		fn(v)
		return nil
	})
}
