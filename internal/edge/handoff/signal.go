package handoff

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// upgradeTimeout is how long a new binary started on SIGUSR2 has to answer
// ready before it is killed and this edge serves on.
const upgradeTimeout = 60 * time.Second

// UpgradeOnSignal starts exe again on every value from sig, handing it
// bound, until stop is closed or one new edge is ready: then it closes
// handedOver and this edge drains. exe "" (this binary's path unknown)
// fails every upgrade, logged.
func UpgradeOnSignal(sig <-chan os.Signal, stop <-chan struct{}, handedOver chan<- struct{}, exe string, bound []Named, log *slog.Logger) {
	for {
		select {
		case <-sig:
		case <-stop:
			return
		}
		if exe == "" {
			log.Error("upgrade failed; this edge keeps serving", "err", "the path of this binary is unknown")
			continue
		}
		log.Info("upgrade: starting the new binary", "exe", exe, "listeners", len(bound))
		pid, err := Upgrade{
			Exe: exe, Args: os.Args[1:], Env: os.Environ(),
			Stdout: os.Stdout, Stderr: os.Stderr, Timeout: upgradeTimeout,
		}.Run(bound)
		if err != nil {
			log.Error("upgrade failed; this edge keeps serving", "err", err)
			continue
		}
		log.Info("upgrade: the new edge is ready; this edge stops accepting and drains", "new_pid", pid)
		close(handedOver)
		return
	}
}

// TellWhenReady tells the edge that started this one (SIGUSR2) that this
// one is ready, once ready says so (what /readyz would answer 200 to);
// never, when ctx ends first.
func (s *Set) TellWhenReady(ctx context.Context, ready func() bool, log *slog.Logger) {
	if err := proc.PollEvery(ctx, 20*time.Millisecond, "readiness", func(context.Context) error {
		if !ready() {
			return errors.New("not ready")
		}
		return nil
	}); err != nil {
		return // stopping before ready: the predecessor serves on
	}
	// The service manager first: it must follow this pid before the
	// previous edge exits.
	if err := Notify(ReadyState(true)); err != nil {
		log.Warn("service manager not told the edge took over", "err", err)
	}
	if err := s.Ready(); err != nil {
		log.Error("upgrade: telling the previous edge this one is ready", "err", err)
		return
	}
	log.Info("upgrade: ready; the previous edge drains", "pid", os.Getpid())
}
