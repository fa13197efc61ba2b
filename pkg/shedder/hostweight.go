package shedder

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Host weight bounds.
const (
	// MaxHostWeight bounds a weight: past a hundred to one, the light
	// hosts' shares round up to one worker each and the ratio stops
	// meaning anything.
	MaxHostWeight = 100
	// MaxHostWeights bounds host_share.weights: the entries are compiled
	// into two maps, read when a host takes a slot in the share table.
	MaxHostWeights = 256
)

// HostWeights weights hosts' shares: a host pattern as the host table and
// the rules write them (an exact name or IP literal, or "*." and a name)
// to an integer weight in [1, 100].
type HostWeights map[string]int

// UnmarshalJSON replaces the weights instead of adding to them:
// encoding/json decodes an object into the map already there, so a
// document's weights would otherwise keep entries it does not name.
func (w *HostWeights) UnmarshalJSON(data []byte) error {
	var m map[string]int
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*w = m
	return nil
}

// validateWeights reports every problem of the weights at once.
func (c HostShareConfig) validateWeights(bad func(field, format string, args ...any)) {
	if c.DefaultWeight < 1 || c.DefaultWeight > MaxHostWeight {
		bad("host_share.default_weight", "must be in [1, %d], got %d", MaxHostWeight, c.DefaultWeight)
	}
	if len(c.Weights) > MaxHostWeights {
		// Past the bound, one problem rather than one per entry.
		bad("host_share.weights", "at most %d entries, got %d", MaxHostWeights, len(c.Weights))
		return
	}
	named := map[string]string{}
	for _, raw := range slices.Sorted(maps.Keys(c.Weights)) {
		field := "host_share.weights[" + strconv.Quote(raw) + "]"
		if w := c.Weights[raw]; w < 1 || w > MaxHostWeight {
			bad(field, "must be in [1, %d], got %d", MaxHostWeight, w)
		}
		p, err := rules.NormalizeHostPattern(raw)
		if err != nil {
			bad(field, "not a host pattern (an exact name or IP address, or \"*.\" and a name): %v", err)
			continue
		}
		if prev, dup := named[p]; dup {
			bad(field, "names the same host as %q (both are %q)", prev, p)
			continue
		}
		named[p] = raw
	}
}

// weightIndex finds a host's weight as the host table finds its entry: an
// exact pattern wins, else the wildcard with the longest suffix.
type weightIndex struct {
	exact map[string]int32
	wild  map[string]int32 // by the suffix after "*."
	// longest is the longest suffix in wild: a long Host of many labels
	// costs no more lookups than that.
	longest int
	def     int32
}

// newWeightIndex compiles c's weights; entries that do not normalise (c
// was not validated) are left out, and a default weight out of range
// counts as 1.
func newWeightIndex(c HostShareConfig) *weightIndex {
	ix := &weightIndex{def: 1}
	if c.DefaultWeight >= 1 && c.DefaultWeight <= MaxHostWeight {
		ix.def = int32(c.DefaultWeight)
	}
	for raw, w := range c.Weights {
		p, err := rules.NormalizeHostPattern(raw)
		if err != nil || w < 1 || w > MaxHostWeight {
			continue
		}
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if ix.wild == nil {
				ix.wild = map[string]int32{}
			}
			ix.wild[suffix] = int32(w)
			ix.longest = max(ix.longest, len(suffix))
		} else {
			if ix.exact == nil {
				ix.exact = map[string]int32{}
			}
			ix.exact[p] = int32(w)
		}
	}
	return ix
}

// of is host's weight: host as rules.NormalizeHost returns it.
func (ix *weightIndex) of(host string) int32 {
	if w, ok := ix.exact[host]; ok {
		return w
	}
	if len(ix.wild) > 0 {
		for i := max(1, len(host)-ix.longest-1); i < len(host); i++ {
			if host[i] != '.' || host[i-1] == '.' {
				continue
			}
			if w, ok := ix.wild[host[i+1:]]; ok {
				return w
			}
		}
	}
	return ix.def
}

// formatWeights writes weights as ApplySettings reads them, sorted.
func formatWeights(w HostWeights) string {
	out := make([]string, 0, len(w))
	for _, k := range slices.Sorted(maps.Keys(w)) {
		out = append(out, k+":"+strconv.Itoa(w[k]))
	}
	return strings.Join(out, ",")
}

// FormatWeights is host_share.weights as `shedder set` takes it.
func (c HostShareConfig) FormatWeights() string { return formatWeights(c.Weights) }

// parseWeights reads "host:weight,host:weight"; the last ':' separates
// the weight, so an IPv6 address may be named. An empty value clears the
// weights.
func parseWeights(val string) (HostWeights, error) {
	items := splitList(val)
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > MaxHostWeights {
		return nil, fmt.Errorf("at most %d entries, got %d", MaxHostWeights, len(items))
	}
	out := HostWeights{}
	for _, item := range items {
		i := strings.LastIndexByte(item, ':')
		if i < 0 {
			return nil, fmt.Errorf("entry %q: want host:weight", item)
		}
		host := strings.TrimSpace(item[:i])
		w, err := strconv.Atoi(strings.TrimSpace(item[i+1:]))
		if err != nil {
			return nil, fmt.Errorf("entry %q: weight: %w", item, err)
		}
		if _, dup := out[host]; dup {
			return nil, fmt.Errorf("entry %q: %s given twice", item, host)
		}
		out[host] = w
	}
	return out, nil
}
