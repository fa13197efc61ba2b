package shedder

import (
	"runtime"
	"time"
)

// cpuProbe measures the process's CPU use between two Measures, as a
// fraction of what its GOMAXPROCS could use (for the rate shares,
// hostrate.go).
type cpuProbe struct {
	read func() time.Duration // the process's CPU time so far
	cpu  time.Duration
	at   time.Time
}

func newCPUProbe(read func() time.Duration) *cpuProbe {
	return &cpuProbe{read: read, cpu: read(), at: time.Now()}
}

// Measure returns the CPU used since the last Measure over what GOMAXPROCS
// could have used in that time (0 where the process's CPU time cannot be
// read).
func (p *cpuProbe) Measure(now time.Time) float64 {
	cpu := p.read()
	used, wall := cpu-p.cpu, now.Sub(p.at)
	p.cpu, p.at = cpu, now
	if cpu == 0 || wall <= 0 {
		return 0
	}
	return float64(used) / (float64(wall) * float64(runtime.GOMAXPROCS(0)))
}
