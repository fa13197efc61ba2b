package pipeline

import (
	"maps"
	"sync"
	"sync/atomic"
)

// series holds the metric children requests look up by label values, each
// made on first use. A lookup loads an immutable map: one atomic load and
// a map access, no lock, and none of the interface hashing sync.Map does
// (a decision's three-string key cost more than the count it fetched). A
// miss, once per label set, copies the map with the new child under mu;
// the label sets are bounded (metrics.go), so copies are few and small.
type series[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// get is k's child, made by newChild the first time k is asked for.
func (s *series[K, V]) get(k K, newChild func() V) V {
	if m := s.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	next := make(map[K]V, 1)
	if old != nil {
		next = maps.Clone(*old)
	}
	v := newChild()
	next[k] = v
	s.m.Store(&next)
	return v
}
