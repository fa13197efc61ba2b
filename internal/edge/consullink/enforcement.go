package consullink

import (
	"errors"
	"fmt"
	"os"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// applyEnforcement applies the region's enforcement document from Consul
// (nil when absent: enforce everything) and keeps it beside the rules cache,
// so an edge restarted while Consul is unreachable runs the same switch.
// Absent once a switch was applied, the switch in force stays and the
// document counts as missing: `enforcement set enforce` writes it explicitly.
func (l *Link) applyEnforcement(data []byte) error {
	if !hasText(data) && l.enforcementFromConsul {
		if l.missing.set(docEnforcement, true) {
			l.log.Warn("enforcement switch missing in consul; keeping the switch in force", "key", l.client.Layout().Enforcement(l.region), "switch", l.switchInForce())
		}
		return nil
	}
	en, err := region.ParseEnforcement(data)
	if err != nil {
		return err
	}
	l.parts.Switch.SetEnforcement(en)
	l.enforcementFromConsul = hasText(data)
	l.missing.set(docEnforcement, false)
	if path := l.enforcementCache(); path != "" {
		if err := WriteFileAtomic(path, data); err != nil {
			l.log.Warn("could not cache the enforcement switch", "path", path, "err", err)
		}
	}
	return nil
}

// enforcementCache is the switch's file beside the rules cache ("" without
// one).
func (l *Link) enforcementCache() string { return l.Beside(".enforcement") }

// Beside names a file kept next to the rules cache, for what else from
// Consul an edge restarted without Consul must still run ("" without a
// rules cache).
func (l *Link) Beside(suffix string) string {
	if l == nil || l.cachePath == "" {
		return ""
	}
	return l.cachePath + suffix
}

// loadEnforcementCache applies the cached switch, and says whether there
// was one (an empty file, kept for a region without a switch, is none).
func (l *Link) loadEnforcementCache() (bool, error) {
	path := l.enforcementCache()
	if path == "" {
		return false, errors.New("no rules cache")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	if !hasText(data) {
		return false, nil
	}
	en, err := region.ParseEnforcement(data)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	l.parts.Switch.SetEnforcement(en)
	l.enforcementFromConsul = true
	return true, nil
}
