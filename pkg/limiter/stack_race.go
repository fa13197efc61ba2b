//go:build race

package limiter

// stackRoom: see stack_norace.go. The race detector's frames are larger
// and its guard twice as big: the stack is made 16 KiB.
const stackRoom = 11 << 10
