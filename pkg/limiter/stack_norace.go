//go:build !race

package limiter

// stackRoom is the frame growStack takes: more than a 4 KiB stack has
// left under the frames above it and the runtime's guard (928 bytes), so
// a 2 or 4 KiB stack is made 8 KiB in one copy; enough for the deepest
// path of a store call seen in a profile (6.8 KiB), and no more to clear.
const stackRoom = 3584
