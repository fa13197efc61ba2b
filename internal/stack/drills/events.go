package drills

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/stack"
)

// Event is one drill event run on its own (cmd/drills kill-master, drain,
// restore), for load tests that bring their own traffic: what was done,
// when, and how long the stack took to show its witness.
type Event struct {
	Event  string `json:"event"`
	Region string `json:"region,omitempty"`
	// Target is what the event hit: the killed master's address, the
	// drained edges.
	Target  string    `json:"target,omitempty"`
	Started time.Time `json:"started"`
	// Witnessed is when the stack showed the event took effect: a replica
	// promoted in the killed master's place, every drained edge's /readyz
	// answering 503, the stack whole again.
	Witnessed time.Time `json:"witnessed"`
	// Took is Witnessed - Started, in seconds.
	Took float64 `json:"took_seconds"`
	// Promoted is the new master after kill-master.
	Promoted string `json:"promoted,omitempty"`
}

// Print writes the event as one JSON line.
func (ev Event) Print(w io.Writer) error {
	ev.Took = ev.Witnessed.Sub(ev.Started).Seconds()
	return json.NewEncoder(w).Encode(ev)
}

// KillMaster SIGKILLs a master of region's Redis (a Cluster master that
// has a replica, or the Sentinel group's master) and waits up to 30 s for
// a replica to take its place. region "" picks the first Sentinel region,
// else the first region. The stack heals by itself; Restore brings the
// killed node back, as a replica.
func (e *Env) KillMaster(ctx context.Context, region string) (Event, error) {
	name, r, err := e.pickRegion(region)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Event: "kill-master", Region: name, Started: time.Now()}
	victim, promoted, err := e.killMaster(ctx, name, r)
	if err != nil {
		return ev, fmt.Errorf("killing a master of %s: %w", name, err)
	}
	master := victim.addr
	ev.Target = master
	if _, err := waitFor(ctx, 30*time.Second, "a replica of "+master+" to be promoted", promoted); err != nil {
		return ev, err
	}
	ev.Witnessed = time.Now()
	if r.Redis.Mode == "sentinel" {
		if ev.Promoted, err = sentinelMaster(ctx, r); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

// DrainRegion SIGTERMs every edge of region, as a rolling shutdown would:
// each reports not ready, leaves DNS and stops after its drain delay. It
// returns once every edge's /readyz answers 503 or no longer answers.
// Restore starts them again.
func (e *Env) DrainRegion(ctx context.Context, region string) (Event, error) {
	r, err := e.region(region)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Event: "drain", Region: region, Started: time.Now()}
	var names []string
	for _, ed := range r.Edges() {
		if _, err := e.signalProc(stack.EdgeID(ed.Name), "edge", syscall.SIGTERM); err != nil {
			return ev, err
		}
		names = append(names, ed.Name)
	}
	ev.Target = strings.Join(names, " ")
	for _, ed := range r.Edges() {
		if _, err := waitFor(ctx, 10*time.Second, ed.Name+" to report draining", func(ctx context.Context) error {
			if c := status(ctx, ed.Admin+"/readyz"); c != http.StatusServiceUnavailable && c != 0 {
				return fmt.Errorf("/readyz %d", c)
			}
			return nil
		}); err != nil {
			return ev, err
		}
	}
	ev.Witnessed = time.Now()
	return ev, nil
}

// Restore brings back whatever a drill stopped (stackctl reconcile, as
// make stack-up would) and returns once every component is ready.
func (e *Env) Restore(ctx context.Context) (Event, error) {
	ev := Event{Event: "restore", Started: time.Now()}
	if err := e.reconcile(ctx); err != nil {
		return ev, err
	}
	ev.Witnessed = time.Now()
	return ev, nil
}

// pickRegion resolves a region name; "" is the first Sentinel region, else
// the first region.
func (e *Env) pickRegion(name string) (string, stack.Region, error) {
	if name != "" {
		r, err := e.region(name)
		return name, r, err
	}
	if n, r, err := e.regionOfMode("sentinel"); err == nil {
		return n, r, nil
	}
	names := sortedNames(e.Out.Regions)
	if len(names) == 0 {
		return "", stack.Region{}, fmt.Errorf("the stack has no region")
	}
	return names[0], e.Out.Regions[names[0]], nil
}
