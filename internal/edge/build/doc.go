// Package build builds parts of the edge from its settings (package
// config): the rate limit store and its limiter, the load shedder and its
// workers, and the request path's settings. The edge wires what it builds
// together; nothing here runs on the request path.
package build
