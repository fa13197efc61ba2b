package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Stalls from outside the test. scripts/busy.sh stalls the Redis servers a
// test run started (SIGSTOP, a few tens of milliseconds, SIGCONT), as a
// fork or an fsync stalls a production Redis. It recognises them by this
// deployment dir (their working directory) holding pulseLock. A test's own
// Freeze must outlast such a stall: a stall ending while the test holds the
// server frozen would resume it early. So both sides signal under an
// exclusive flock on pulseLock, and a frozen server is marked by a file
// frozenPrefix+pid, on which a stall neither starts nor ends. A test whose
// own freezes are its stress keeps the mark for as long as that stress
// runs (exempt), so that no stall lands in the gaps between its freezes.
const (
	pulseLock    = "pulse.lock"
	frozenPrefix = "frozen-"
)

// createPulseLock makes d's servers recognisable to the stall pulser.
func (d *deployment) createPulseLock() error {
	return os.WriteFile(filepath.Join(d.dir, pulseLock), nil, 0o600)
}

// hold is why a process carries the frozen mark: the test froze it, or
// exempted it from stalls (claims counts the exemptions not yet released).
type hold struct {
	frozen bool
	claims int
}

// freeze stops p (SIGSTOP) and marks it frozen by the test.
func (d *deployment) freeze(p *process) {
	d.underPulseLock(func() {
		d.mark(p, func(h *hold) { h.frozen = true })
		p.signal(syscall.SIGSTOP)
	})
}

// thaw resumes p (SIGCONT); the mark stays while p is exempt.
func (d *deployment) thaw(p *process) {
	d.underPulseLock(func() {
		d.mark(p, func(h *hold) { h.frozen = false })
		p.signal(syscall.SIGCONT)
	})
}

// exempt marks p so that the pulser leaves it alone until release, through
// the test's own freezes and thaws. Unless the test froze it, p is resumed:
// a stall under way as the mark appears would not be ended by the pulser.
func (d *deployment) exempt(p *process) (release func()) {
	d.underPulseLock(func() {
		if !d.mark(p, func(h *hold) { h.claims++ }) {
			p.signal(syscall.SIGCONT)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			d.underPulseLock(func() { d.mark(p, func(h *hold) { h.claims-- }) })
		})
	}
}

// mark applies update to p's hold and makes the frozen mark match it: there
// while p is frozen or exempt. It reports whether p is frozen.
func (d *deployment) mark(p *process, update func(*hold)) (frozen bool) {
	d.mu.Lock()
	if d.holds == nil {
		d.holds = map[*process]*hold{}
	}
	h := d.holds[p]
	if h == nil {
		h = &hold{}
		d.holds[p] = h
	}
	update(h)
	frozen, marked := h.frozen, h.frozen || h.claims > 0
	d.mu.Unlock()
	if marked {
		_ = os.WriteFile(d.frozenMark(p), nil, 0o600)
	} else {
		_ = os.Remove(d.frozenMark(p))
	}
	return frozen
}

func (d *deployment) frozenMark(p *process) string {
	return filepath.Join(d.dir, frozenPrefix+strconv.Itoa(p.Cmd.Process.Pid))
}

// underPulseLock runs f holding the flock on pulseLock. Without the file
// (the deployment is closed) f runs anyway: no pulser looks there either.
func (d *deployment) underPulseLock(f func()) {
	lock, err := os.Open(filepath.Join(d.dir, pulseLock))
	if err != nil {
		f()
		return
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		f()
		return
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	f()
}
