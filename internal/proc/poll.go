package proc

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// permanentError tells Poll that waiting longer cannot help.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that Poll returns it at once instead of retrying.
func Permanent(err error) error { return &permanentError{err} }

// Poll runs check until it returns nil, backing off from 20 ms to 250 ms:
// short enough that startup and failover waits add little latency, long
// enough not to hammer servers that are busy electing a new master.
func Poll(ctx context.Context, what string, check func(context.Context) error) error {
	return poll(ctx, 20*time.Millisecond, 250*time.Millisecond, what, check)
}

// PollEvery runs check every interval until it returns nil; for waits whose
// duration is measured, where a growing interval would blur the figure.
func PollEvery(ctx context.Context, interval time.Duration, what string, check func(context.Context) error) error {
	return poll(ctx, interval, interval, what, check)
}

func poll(ctx context.Context, delay, maxDelay time.Duration, what string, check func(context.Context) error) error {
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if perr, ok := errors.AsType[*permanentError](err); ok {
			return fmt.Errorf("waiting for %s: %w", what, perr.err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(delay*3/2, maxDelay)
	}
}
