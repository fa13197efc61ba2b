package testenv

import (
	"fmt"
	"syscall"
)

// Freeze stops the server (SIGSTOP): its connections stay open and nothing
// answers, as with a starved, swapped-out or paused Redis. Thaw resumes it;
// commands that arrived meanwhile then run.
func (s *Standalone) Freeze() { s.proc().signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Standalone) Thaw() { s.proc().signal(syscall.SIGCONT) }

func (s *Standalone) proc() *process {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.procs[0]
}

// FreezeNode stops the Cluster node at addr (SIGSTOP). Past the cluster's
// node timeout (1 s) its replica is promoted; shorter freezes are slowness.
func (c *Cluster) FreezeNode(addr string) error { return c.signalNode(addr, syscall.SIGSTOP) }

// ThawNode resumes a frozen Cluster node (SIGCONT).
func (c *Cluster) ThawNode(addr string) error { return c.signalNode(addr, syscall.SIGCONT) }

func (c *Cluster) signalNode(addr string, sig syscall.Signal) error {
	p := c.node(addr)
	if p == nil {
		return fmt.Errorf("testenv: signalling node: no cluster node at %s", addr)
	}
	p.signal(sig)
	return nil
}
