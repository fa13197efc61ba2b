package consullink

import (
	"context"
	"time"
)

// ticketRotationCheck is how often an edge looks whether a rotation is due.
const ticketRotationCheck = time.Minute

// rotateTicketKeys rotates the region's keys when due, until ctx is done.
func (l *Link) rotateTicketKeys(ctx context.Context) {
	t := time.NewTicker(ticketRotationCheck)
	defer t.Stop()
	for {
		l.rotateIfDue(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rotateIfDue rotates the keys if the last rotation is at least
// --tls-ticket-rotation before now; it reports whether this edge did.
func (l *Link) rotateIfDue(ctx context.Context, now time.Time) bool {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done, err := l.client.RotateTicketKeys(cctx, l.region, l.rotation, now)
	if err != nil {
		if ctx.Err() == nil {
			l.m.Errors.Inc()
			l.log.Warn("session ticket keys not rotated; trying again later", "err", err)
		}
		return false
	}
	if done {
		l.log.Info("session ticket keys rotated", "region", l.region, "every", l.rotation)
	}
	return done
}
