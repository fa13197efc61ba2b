package shedder

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// A slot TakeUnless took counts as busy until released, and one a queued
// request waited for is handed over by Release as by a release func.
func TestWorkersTakeUnless(t *testing.T) {
	w := NewWorkers(2, 1, time.Minute)
	s1, err := w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	s2, err := w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	require.Equal(t, 2, w.Busy())

	got := make(chan error, 1)
	var s3 Slot
	go func() {
		var err error
		s3, err = w.TakeUnless(context.Background(), TierRead, nil)
		got <- err
	}()
	// The third waits in the queue, the fourth finds it full.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, proc.PollEvery(ctx, time.Millisecond, "the third request queued", func(context.Context) error {
		if w.Queued() != 1 {
			return errors.New("not queued yet")
		}
		return nil
	}))
	_, err = w.TakeUnless(context.Background(), TierRead, nil)
	require.ErrorIs(t, err, ErrQueueFull)

	s1.Release()
	require.NoError(t, <-got)
	require.Equal(t, 2, w.Busy(), "the released slot went to the waiter")
	s2.Release()
	s3.Release()
	require.Equal(t, 0, w.Busy())
}
