package region

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/strictjson"
)

// KindEnforcement is the history kind of a region's enforcement switch.
const KindEnforcement = "enforcement"

// Enforcement modes.
const (
	ModeEnforce = "enforce" // rules deny (all keys, or Percent of them)
	ModeShadow  = "shadow"  // every rule of the region counts and never denies
)

// Enforcement is a region's enforcement switch: one small JSON document per
// region (enforcement/<region>), pushed and rolled back like the rules, read
// by every edge of the region with its own blocking query, so a switch is
// in force on the whole region as soon as the edges see the key change.
// A rule marked shadow in the rules stays shadow whatever the switch says.
//
//	{"mode": "shadow"}                   the whole region counts, denies nothing
//	{"mode": "enforce", "percent": 10}   10 % of each rule's keys are enforced,
//	                                     the others count as shadow
//
// An absent document, or {"mode": "enforce"}, enforces every key; an edge
// that ran a switch keeps it while the document is absent (a Consul rebuilt
// empty must not change a region's switch), so {"mode": "enforce"} is how
// a switch is cleared.
type Enforcement struct {
	Mode string `json:"mode"`
	// Percent is the share of keys enforced in mode enforce, 0 to 100 in
	// steps of 0.01. Which keys: a stable hash of the limit key (rule id
	// and descriptor values), the same on every edge and across restarts,
	// so a client stays in or out while the percentage holds, and raising
	// it only adds keys.
	Percent float64 `json:"percent"`
}

// DefaultEnforcement enforces everything.
func DefaultEnforcement() Enforcement { return Enforcement{Mode: ModeEnforce, Percent: 100} }

// ParseEnforcement reads an enforcement document strictly (pkg/strictjson:
// unknown keys, keys in another case and repeated keys are errors); empty
// data is the default. A missing percent is 100.
func ParseEnforcement(data []byte) (Enforcement, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return DefaultEnforcement(), nil
	}
	var raw struct {
		Mode    string   `json:"mode"`
		Percent *float64 `json:"percent"`
	}
	if err := strictjson.Unmarshal(data, &raw); err != nil {
		return Enforcement{}, fmt.Errorf("parsing enforcement switch: %w", err)
	}
	en := Enforcement{Mode: raw.Mode, Percent: 100}
	if raw.Percent != nil {
		en.Percent = *raw.Percent
	}
	if en.Mode == "" {
		en.Mode = ModeEnforce
	}
	return en, en.Validate()
}

// Validate reports every problem of the switch.
func (en Enforcement) Validate() error {
	var errs []error
	switch en.Mode {
	case ModeEnforce, ModeShadow:
	default:
		errs = append(errs, fmt.Errorf("mode: must be %q or %q, got %q", ModeEnforce, ModeShadow, en.Mode))
	}
	switch {
	case math.IsNaN(en.Percent) || en.Percent < 0 || en.Percent > 100:
		errs = append(errs, fmt.Errorf("percent: must be between 0 and 100, got %v", en.Percent))
	case !onStep(en.Percent):
		// A finer share would be rounded to a bucket: 0.001 would enforce
		// one key in 10,000 while saying (and the gauge showing) otherwise.
		errs = append(errs, fmt.Errorf("percent: must be in steps of 0.01 (one key in %d), got %v", Buckets, en.Percent))
	case en.Mode == ModeShadow && en.Percent != 100:
		errs = append(errs, errors.New("percent: only with mode enforce (shadow enforces no key)"))
	}
	return errors.Join(errs...)
}

// onStep says whether percent is a whole number of buckets (steps of
// 0.01), allowing for the binary spelling of decimals (33.33 × 100 is
// 3332.9999999999995).
func onStep(percent float64) bool {
	b := percent * Buckets / 100
	return math.Abs(b-math.Round(b)) < 1e-6
}

// Marshal is the switch as stored: canonical JSON.
func (en Enforcement) Marshal() []byte {
	if en.Mode == ModeShadow {
		return []byte(`{"mode":"shadow"}`)
	}
	data, _ := json.Marshal(en)
	return data
}

// Version identifies the switch's meaning (not its spelling): 12 hex digits.
func (en Enforcement) Version() string {
	sum := sha256.Sum256(en.Marshal())
	return hex.EncodeToString(sum[:])[:12]
}

// String is the switch for people: "enforce", "shadow", "enforce 10%".
func (en Enforcement) String() string {
	if en.Mode == ModeEnforce && en.Percent != 100 {
		return fmt.Sprintf("enforce %g%%", en.Percent)
	}
	return en.Mode
}

// Buckets is how finely Percent divides the keys: steps of 0.01 %.
const Buckets = 10000

// Threshold is the number of buckets (of Buckets) enforced.
func (en Enforcement) Threshold() uint64 {
	if en.Mode == ModeShadow {
		return 0
	}
	return uint64(math.Round(en.Percent * Buckets / 100))
}

// Bucket is key's bucket in [0, Buckets): FNV-1a, the same on every edge.
func Bucket(key string) uint64 {
	// hash/fnv's 64-bit FNV-1a, inlined: no allocation per request.
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h % Buckets
}

// Enforcement is where a region's enforcement switch lives.
func (l Layout) Enforcement(region string) string { return l.Prefix + "enforcement/" + region }

// WatchEnforcement calls fn with the region's enforcement document (nil
// when absent) now and after every change.
func (c *Client) WatchEnforcement(ctx context.Context, region string, fn func([]byte), onErr func(error)) {
	c.watchKey(ctx, c.layout.Enforcement(region), fn, onErr)
}

// watchKey calls fn with one key's value (nil when absent) now and after
// every change of it.
func (c *Client) watchKey(ctx context.Context, key string, fn func([]byte), onErr func(error)) {
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
