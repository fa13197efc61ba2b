package limiter

// A store call runs on a worker (workers.go: Limiter.take, lane.drain),
// a goroutine that starts with a small stack; go-redis's call path is deep
// (about 7 KiB of frames from take to the socket read). Grown on demand,
// the stack is copied halfway down that path, every frame above walked and
// adjusted: about a tenth of `edge rls`'s CPU per decision in a profile.
// growStack, called by the worker before each call, asks for the room at
// once, while the stack holds one or two frames and the copy costs a
// clear of stackRoom bytes. A kept worker's stack is usually big enough
// already (growStack then copies nothing); after a collection shrank it
// while the worker was idle, the copy is again a shallow one.

// growStack grows the calling goroutine's stack to 8 KiB (16 KiB in a
// race detector build) unless it is already that big.
//
//go:noinline
func growStack() {
	var room [stackRoom]byte
	keepOnStack(room[:])
}

// keepOnStack keeps growStack's frame from being optimized away.
//
//go:noinline
func keepOnStack([]byte) {}
