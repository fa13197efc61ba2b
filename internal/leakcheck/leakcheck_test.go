package leakcheck

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFindReportsAGoroutineLeftRunning(t *testing.T) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-stop
	}()
	require.ErrorContains(t, Find(), "TestFindReportsAGoroutineLeftRunning")
	close(stop)
	<-done
	require.NoError(t, Find())
}
