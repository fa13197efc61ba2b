package testenv

import "fmt"

// Freeze stops the server (SIGSTOP): its connections stay open and nothing
// answers, as with a starved, swapped-out or paused Redis. Thaw resumes it;
// commands that arrived meanwhile then run.
func (s *Standalone) Freeze() { s.d.freeze(s.proc()) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Standalone) Thaw() { s.d.thaw(s.proc()) }

func (s *Standalone) proc() *process {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.d.procs[0]
}

// FreezeNode stops the Cluster node at addr (SIGSTOP). Past the cluster's
// node timeout (1 s) its replica is promoted; shorter freezes are slowness.
func (c *Cluster) FreezeNode(addr string) error { return c.signalNode(addr, c.d.freeze) }

// ThawNode resumes a frozen Cluster node (SIGCONT).
func (c *Cluster) ThawNode(addr string) error { return c.signalNode(addr, c.d.thaw) }

// ExemptNode keeps scripts/busy.sh's stalls off the Cluster node at addr
// until release, for a test whose own freezes of it are the stress: a stall
// landing between two of them would make one silence of their sum.
func (c *Cluster) ExemptNode(addr string) (release func(), err error) {
	p := c.node(addr)
	if p == nil {
		return nil, fmt.Errorf("testenv: exempting node: no cluster node at %s", addr)
	}
	return c.d.exempt(p), nil
}

func (c *Cluster) signalNode(addr string, signal func(*process)) error {
	p := c.node(addr)
	if p == nil {
		return fmt.Errorf("testenv: signalling node: no cluster node at %s", addr)
	}
	signal(p)
	return nil
}
