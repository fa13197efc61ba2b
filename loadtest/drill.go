package edgeguard

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"time"
)

// Mark is mark(name): record that an event happens now (a drill started, a
// region drained). Marks are shared by every VU; the first mark of a name
// wins, so a mark is an event's time, not its last repetition.
func (mi *ModuleInstance) Mark(name string) float64 {
	now := time.Now()
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	if mi.root.marks == nil {
		mi.root.marks = map[string]time.Time{}
	}
	if t, ok := mi.root.marks[name]; ok {
		return float64(t.UnixMicro()) / 1000
	}
	mi.root.marks[name] = now
	return float64(now.UnixMicro()) / 1000
}

// MarkAt is markAt(name, ms): record that an event happened at ms (a now()
// reading, or a time a drill tool reported), first mark of a name winning
// as with mark.
func (mi *ModuleInstance) MarkAt(name string, ms float64) (float64, error) {
	if name == "" || math.IsNaN(ms) || math.IsInf(ms, 0) || ms <= 0 {
		return 0, fmt.Errorf("markAt: want a name and a time in ms since the epoch, got %q, %v", name, ms)
	}
	at := fromMillis(ms)
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	if mi.root.marks == nil {
		mi.root.marks = map[string]time.Time{}
	}
	if t, ok := mi.root.marks[name]; ok {
		return float64(t.UnixMicro()) / 1000, nil
	}
	mi.root.marks[name] = at
	return ms, nil
}

// Marks is marks(): every mark so far, name → now() reading.
func (mi *ModuleInstance) Marks() map[string]float64 {
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	out := make(map[string]float64, len(mi.root.marks))
	for k, t := range mi.root.marks {
		out[k] = float64(t.UnixMicro()) / 1000
	}
	return out
}

// RunResult is what run() returns.
type RunResult struct {
	Code    int     `js:"code"`
	Output  string  `js:"output"`
	Started float64 `js:"started"`
	Ended   float64 `js:"ended"`
}

// Run is run(name, argv): run a drill command (e.g. the stack's tooling
// that kills a Redis master) to completion, marking <name>_start and
// <name>_end around it. A non-zero exit is returned, not thrown, so the
// scenario can record it; a command that cannot start is an error.
func (mi *ModuleInstance) Run(name string, argv []string) (*RunResult, error) {
	if name == "" || len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("run: want a name and a command")
	}
	cmd := exec.CommandContext(mi.vu.Context(), argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	r := &RunResult{Started: mi.Mark(name + "_start")}
	err := cmd.Run()
	r.Ended = mi.Mark(name + "_end")
	r.Output = out.String()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	return r, nil
}
