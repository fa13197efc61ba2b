package rules

import "fmt"

// KeyOf is the counter key the rule with this id derives from the key
// values parts, one per descriptor of its key, spelled as an override's
// key is (an "ip" part is a client address, the others the values as
// sent): the same key Match gives a request carrying those values. A rule
// test states what a request should be counted by without spelling the
// hash.
func (s *Snapshot) KeyOf(id string, parts []string) (string, error) {
	if s == nil {
		return "", fmt.Errorf("no rules")
	}
	for i := range s.rules {
		r := &s.rules[i]
		if r.ID != id {
			continue
		}
		if len(parts) != len(r.descriptors) {
			return "", fmt.Errorf("rule %s is keyed by %d values (%v), got %d", id, len(r.descriptors), r.Key, len(parts))
		}
		req := requestOf(r.descriptors, parts)
		key, ok := s.key(r, &req)
		if !ok {
			return "", fmt.Errorf("rule %s derives no key from %q (an empty value, or an ip part that is not an address)", id, parts)
		}
		return key, nil
	}
	return "", fmt.Errorf("no rule %s", id)
}
