package peerbench

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// cpuPlan is where Tenants runs what, when it pins: the proxy under test
// alone on one CPU, and this program (b.example's client), the origin and
// a.example's clients, which inherit its affinity, on the others. Without
// it, on a machine of few cores, the flood's generator and the origin take
// the proxy's CPU and the run judges the machine, not the isolation.
type cpuPlan struct {
	proxy  int   // the proxy's CPU
	others []int // everything else's
	saved  unix.CPUSet
}

// allowedCPUs are the CPUs this process may run on (what nproc counts).
func allowedCPUs() ([]int, unix.CPUSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, set, fmt.Errorf("reading this process's CPUs: %w", err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, set, nil
}

// planCPUs gives the proxy the first CPU this process may use and moves
// every thread of this process to the others, so the children it starts
// from now on begin there. A machine (or a cpuset) of one CPU cannot be
// split: that is an error naming the way out.
func planCPUs() (*cpuPlan, error) {
	cpus, saved, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	if len(cpus) < 2 {
		return nil, fmt.Errorf("pinning the proxy to a CPU of its own needs 2 CPUs, this process may use %d (nproc): run with -pin=false to measure unpinned, on shared CPUs", len(cpus))
	}
	p := &cpuPlan{proxy: cpus[0], others: cpus[1:], saved: saved}
	if _, err := pinTasks(os.Getpid(), cpuSet(p.others)); err != nil {
		return nil, fmt.Errorf("moving this program to CPUs %v: %w", p.others, err)
	}
	return p, nil
}

// restore gives this process its CPUs back.
func (p *cpuPlan) restore() {
	if p != nil {
		_, _ = pinTasks(os.Getpid(), p.saved)
	}
}

// pinProxy moves the proxy (pid and its child processes: nginx's workers)
// to the proxy's CPU and returns how many threads it moved.
func (p *cpuPlan) pinProxy(pid int) (int, error) {
	n := 0
	set := cpuSet([]int{p.proxy})
	for _, q := range tree(pid) {
		m, err := pinTasks(q, set)
		if err != nil {
			return n, fmt.Errorf("pinning process %d to CPU %d: %w", q, p.proxy, err)
		}
		n += m
	}
	return n, nil
}

func (p *cpuPlan) String() string {
	if p == nil {
		return "not pinned: the proxy, the origin and the clients share every CPU"
	}
	return fmt.Sprintf("the proxy pinned to CPU %d, alone; the origin, the flood's and b.example's clients and this program to CPU %v", p.proxy, p.others)
}

func cpuSet(cpus []int) unix.CPUSet {
	var s unix.CPUSet
	for _, c := range cpus {
		s.Set(c)
	}
	return s
}

// pinTasks sets the affinity of every thread of process pid (the Linux
// call sets one thread's) and returns how many it set. A thread started
// meanwhile by one not yet moved is caught by the next pass; the passes
// stop when one finds no thread left to move.
func pinTasks(pid int, set unix.CPUSet) (int, error) {
	done := map[int]bool{}
	for range 10 {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			return len(done), err
		}
		moved := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return len(done), err
			}
			done[tid] = true
			moved++
		}
		if moved == 0 {
			return len(done), nil
		}
	}
	return len(done), nil
}

// threadsOn counts the threads of pid and its child processes, and how
// many of them may run on cpu only: the pin, read back.
func threadsOn(pid, cpu int) (only, all int) {
	for _, q := range tree(pid) {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(q) + "/task")
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			var s unix.CPUSet
			if unix.SchedGetaffinity(tid, &s) != nil {
				continue
			}
			all++
			if s.Count() == 1 && s.IsSet(cpu) {
				only++
			}
		}
	}
	return only, all
}
