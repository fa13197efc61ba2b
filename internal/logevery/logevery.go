// Package logevery keeps a repeated warning from becoming one log line per
// event: it lets one through, then at most one per Every, and counts what it
// held back in between.
package logevery

import (
	"sync"
	"time"
)

// Every is the least time between two lines of one Gate.
const Every = 30 * time.Second

// Gate lets a repeated warning through once, then at most once per Every.
// The zero value is ready to use.
type Gate struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether to log now, and how many were held back since the
// last line.
func (g *Gate) Allow(now time.Time) (bool, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) < Every {
		g.suppressed++
		return false, 0
	}
	n := g.suppressed
	g.last, g.suppressed = now, 0
	return true, n
}
