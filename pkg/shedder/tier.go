package shedder

import (
	"fmt"
	"strings"
)

// Tier is a request's shedding class. The numeric order is the shedding
// order: lower tiers are cut completely before a higher one loses anything.
type Tier int

// Tiers, lowest (first shed) to highest (never shed by the ramp).
const (
	// TierNone is reported by CutoffTier when nothing is being shed; it is
	// never the class of a request.
	TierNone Tier = -1
	// TierTest is synthetic and test-mode traffic: losing it costs no user.
	TierTest Tier = 0
	// TierRead is GET/HEAD/OPTIONS: clients retry reads safely.
	TierRead Tier = 1
	// TierWrite is every other method: shed last because a lost write is
	// what users notice.
	TierWrite Tier = 2
	// TierCritical is never shed by the ramp; only the worker cap protects
	// the node from it.
	TierCritical Tier = 3
)

// numTiers sizes the per-tier arrays; tiers index them directly.
const numTiers = 4

// sheddable lists the tiers the ramp may cut, in cut order.
var sheddable = [...]Tier{TierTest, TierRead, TierWrite}

var tierNames = [numTiers]string{"test", "read", "write", "critical"}

// String returns the tier's config and label spelling.
func (t Tier) String() string {
	if t.valid() {
		return tierNames[t]
	}
	if t == TierNone {
		return "none"
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

func (t Tier) valid() bool { return t >= 0 && t < numTiers }

// ParseTier parses a tier name (case-insensitive, surrounding space
// ignored). "none" is not accepted: it is not a class a request can have.
func ParseTier(s string) (Tier, error) {
	s = strings.TrimSpace(s)
	for i, name := range tierNames {
		if strings.EqualFold(s, name) {
			return Tier(i), nil
		}
	}
	return TierNone, fmt.Errorf("%w: unknown tier %q (want test, read, write or critical)", ErrInvalidConfig, s)
}

// MarshalText lets tiers appear by name in JSON and YAML configs.
func (t Tier) MarshalText() ([]byte, error) {
	if !t.valid() {
		return nil, fmt.Errorf("%w: cannot marshal %s", ErrInvalidConfig, t)
	}
	return []byte(t.String()), nil
}

// UnmarshalText is the inverse of MarshalText.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}
