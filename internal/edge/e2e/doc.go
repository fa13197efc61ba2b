// Package e2e tests the edge as a process: the real cmd/edge binary, built
// once per test run, started with flags on loopback ports in front of an
// origin in the test process and real Redis deployments (Cluster, Sentinel)
// started by internal/testenv. It holds tests only: exact limits across
// several edges sharing one Redis Cluster, per-key coalescing measured on the
// Redis side, Cluster and Sentinel failovers under load, graceful shutdown,
// refusal of an invalid rules file and the fail modes with Redis down.
package e2e
