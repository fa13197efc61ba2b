package region

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/hashicorp/consul/api"
)

// Backoff between failed blocking queries: from 100ms, doubling, to 10s,
// each wait jittered (see jittered).
const (
	backoffMin = 100 * time.Millisecond
	backoffMax = 10 * time.Second
)

// jittered is the wait for a backoff step of base, given r drawn uniformly
// from [0, 1): somewhere between half of base and base. Without it, edges
// that lost Consul together (an agent restart, a fleet restart, a network
// blip) would retry in lock-step, every step doubling together, and land on
// the recovering agent all at once each time; with it their retries spread
// over half of each step, and never come sooner than half of it.
func jittered(base time.Duration, r float64) time.Duration {
	r = min(max(r, 0), 1)
	return base/2 + time.Duration(r*float64(base/2))
}

// nextBackoff is the backoff step after base: doubled, up to backoffMax.
func nextBackoff(base time.Duration) time.Duration {
	return min(2*base, backoffMax)
}

// WatchRules calls fn with the region's rule documents now and after every
// change, using Consul blocking queries (index-based) in the local
// datacenter, until ctx is done. Errors are passed to onErr and retried with
// backoff; fn runs only when the documents' content changed. A document
// stored in parts is passed whole, or not at all: when a part cannot be read
// or does not match its hash, fn is not called (the caller keeps what it
// has) and the read is retried.
func (c *Client) WatchRules(ctx context.Context, region string, fn func(Docs), onErr func(error)) {
	c.WatchPoPRules(ctx, region, "", fn, onErr)
}

// WatchShedder calls fn with the region's shedder document (nil when absent)
// now and after every change.
func (c *Client) WatchShedder(ctx context.Context, region string, fn func([]byte), onErr func(error)) {
	c.WatchPoPShedder(ctx, region, "", func(doc []byte, _ bool) { fn(doc) }, onErr)
}

// WatchPoPShedder is WatchShedder for an edge of pop: while a shedder
// canary key of pop exists, its document stands for the region's, and fn
// is told so (canary true). One watch of the shedder prefix sees both keys.
func (c *Client) WatchPoPShedder(ctx context.Context, region, pop string, fn func(doc []byte, canary bool), onErr func(error)) {
	c.watchPoP(ctx, CanaryShedder, c.layout.Shedder(region), region, pop, func(doc []byte, _ uint64, canary bool) { fn(doc, canary) }, onErr)
}

// watchPoP watches the kind's prefix for key and pop's canary key of that
// kind ("" pop: none), calling fn with the canary's value while it exists,
// key's otherwise (nil and 0 when absent), with the value's ModifyIndex,
// now and after every change of the value or of which key it came from. A
// value stored in parts is passed whole, or not at all: a part that cannot
// be read is retried, an invalid manifest reported and skipped.
func (c *Client) watchPoP(ctx context.Context, kind CanaryKind, key, region, pop string, fn func(doc []byte, index uint64, canary bool), onErr func(error)) {
	canaryKey := ""
	if pop != "" {
		canaryKey = c.layout.Canary(kind, region, pop)
	}
	var last []byte
	lastCanary, first := false, true
	c.watch(ctx, c.layout.Prefix+string(kind)+"/", onErr, func(pairs api.KVPairs) error {
		var v, cv []byte
		var index, cindex uint64
		canary := false
		for _, p := range pairs {
			switch p.Key {
			case key: // not <kind>/<region>-2
				v, index = p.Value, p.ModifyIndex
			case canaryKey:
				cv, cindex, canary = p.Value, p.ModifyIndex, true
			}
		}
		if canary {
			v, index = cv, cindex
		}
		if !first && bytes.Equal(v, last) && canary == lastCanary {
			return nil
		}
		whole, err := c.Resolve(ctx, region, v)
		if errors.Is(err, ErrInvalidManifest) {
			// Refused as it stands, not retried (as WatchPoPRules).
			first, last, lastCanary = false, v, canary
			return &RefusedError{Err: err}
		}
		if err != nil {
			return err
		}
		first, last, lastCanary = false, v, canary // as stored: a manifest is compared, not its parts
		fn(whole, index, canary)
		return nil
	})
}

// RefusedError is a document a watch read and refused as it stands (an
// invalid manifest): reported to onErr once, not retried; the watch goes on
// with the next change.
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return "document refused: " + e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// PanicError is a panic recovered in a watch (reading a document, or the
// caller's function): reported to onErr, then the watch retries with
// backoff from a fresh read, as after a failed query.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("recovered panic: %v", e.Value) }

// Recover runs f, turning a panic in it into a *PanicError.
func Recover(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return f()
}

// watch runs blocking List queries on prefix. An error from fn counts as a
// failed query: reported, then retried with backoff from a fresh read; a
// RefusedError is reported and the watch goes on; a panic in the query or
// in fn is a PanicError, retried like an error.
func (c *Client) watch(ctx context.Context, prefix string, onErr func(error), fn func(api.KVPairs) error) {
	var index uint64
	wait := backoffMin
	for ctx.Err() == nil {
		var pairs api.KVPairs
		var meta *api.QueryMeta
		err := Recover(func() (err error) {
			q := (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx)
			pairs, meta, err = c.api.KV().List(prefix, q)
			return err
		})
		if err == nil {
			err = filtered("watching "+prefix, meta)
		}
		var refused *RefusedError
		if err != nil {
			if !errors.As(err, new(*PanicError)) {
				err = classify("watching "+prefix, err)
			}
		} else if meta.LastIndex != index && meta.LastIndex >= index {
			err = Recover(func() error { return fn(pairs) })
			if err == nil || errors.As(err, &refused) {
				index = meta.LastIndex
			}
			if refused != nil {
				if onErr != nil {
					onErr(err)
				}
				err = nil
			}
		} else if meta.LastIndex < index {
			// An index that goes backwards (a restarted agent, a snapshot
			// restore) restarts the watch from scratch, as Consul advises.
			index = 0
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if onErr != nil {
				onErr(err)
			}
			index = 0
			select {
			case <-ctx.Done():
				return
			case <-time.After(jittered(wait, rand.Float64())):
			}
			wait = nextBackoff(wait)
			continue
		}
		wait = backoffMin
	}
}
