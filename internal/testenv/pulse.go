package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Stalls from outside the test. scripts/busy.sh stalls the Redis servers a
// test run started (SIGSTOP, a few tens of milliseconds, SIGCONT), as a
// fork or an fsync stalls a production Redis. It recognises them by this
// deployment dir (their working directory) holding pulseLock. A test's own
// Freeze must outlast such a stall: a stall ending while the test holds the
// server frozen would resume it early. So both sides signal under an
// exclusive flock on pulseLock, and a frozen server is marked by a file
// frozenPrefix+pid, on which a stall neither starts nor ends.
const (
	pulseLock    = "pulse.lock"
	frozenPrefix = "frozen-"
)

// createPulseLock makes d's servers recognisable to the stall pulser.
func (d *deployment) createPulseLock() error {
	return os.WriteFile(filepath.Join(d.dir, pulseLock), nil, 0o600)
}

// freeze stops p (SIGSTOP) and marks it frozen by the test.
func (d *deployment) freeze(p *process) {
	d.underPulseLock(func() {
		_ = os.WriteFile(d.frozenMark(p), nil, 0o600)
		p.signal(syscall.SIGSTOP)
	})
}

// thaw removes the mark and resumes p (SIGCONT).
func (d *deployment) thaw(p *process) {
	d.underPulseLock(func() {
		_ = os.Remove(d.frozenMark(p))
		p.signal(syscall.SIGCONT)
	})
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
