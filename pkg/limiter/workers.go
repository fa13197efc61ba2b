package limiter

import (
	"sync"
	"sync/atomic"
	"time"
)

// workers are the goroutines store calls run on (Limiter.take's remote
// call, a lane's drain), kept from one call to the next. Such a call runs
// on a goroutine of its own so that its caller can stop waiting at the
// deadline; a goroutine started for each call took a fresh stack, grew it
// to the depth of go-redis's path (growStack) and freed it when it ended:
// goroutine starts and stack growth were 4.5 % of `edge rls`'s CPU in a
// profile, 1.6 % with workers. A worker that has finished a call takes
// the next one handed to it, on the stack it already has. One left idle
// for workerIdle ends, so a quiet process keeps none, and a limiter nobody
// closes leaves nothing running for long; stop ends the idle ones at once.
//
// The zero value works: every call then gets a goroutine of its own.
type workers struct {
	jobs     chan job // unbuffered: a send succeeds only into an idle worker
	stopped  chan struct{}
	stopOnce sync.Once
	idle     time.Duration // workerIdle (0: none kept)
	running  atomic.Int32
}

const (
	// maxWorkers bounds the workers kept; past it (a store frozen with
	// calls piling up until lateTimeout) a call gets a goroutine of its
	// own, as without workers.
	maxWorkers = 1024
	// workerIdle is how long a worker waits for its next call: at ten
	// calls a second and more, calls find a worker waiting.
	workerIdle = 100 * time.Millisecond
)

func newWorkers() *workers {
	return &workers{jobs: make(chan job), stopped: make(chan struct{}), idle: workerIdle}
}

// job is what a worker runs: a func (jobFunc), or a value that carries its
// own state (a run), which costs no closure.
type job interface{ work() }

type jobFunc func()

func (f jobFunc) work() { f() }

// stop ends the idle workers, and each busy one once its call is done.
// A call run afterwards still runs (on a goroutine of its own).
func (w *workers) stop() {
	w.stopOnce.Do(func() {
		if w.stopped != nil {
			close(w.stopped)
		}
	})
}

// run runs f on an idle worker, or on a new one.
func (w *workers) run(f func()) { w.runJob(jobFunc(f)) }

// runJob is run for a job.
func (w *workers) runJob(f job) {
	select {
	case w.jobs <- f:
		return
	default:
	}
	if w.running.Add(1) > maxWorkers {
		w.running.Add(-1)
		go func() {
			growStack()
			f.work()
		}()
		return
	}
	go w.work(f)
}

// work runs f, then each call handed over, until none comes for w.idle
// or the workers are stopped.
func (w *workers) work(f job) {
	defer w.running.Add(-1)
	idle := time.NewTimer(w.idle)
	defer idle.Stop()
	for {
		growStack() // a copy only after a collection shrank the stack
		f.work()
		f = nil // nothing of the call is kept while idle
		idle.Reset(w.idle)
		select {
		case f = <-w.jobs:
		case <-idle.C:
			return
		case <-w.stopped:
			return
		}
	}
}
