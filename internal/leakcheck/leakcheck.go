// Package leakcheck fails a test binary whose goroutines outlive its
// tests (go.uber.org/goleak, with the fasthttp goroutines nobody can stop
// named and explained). It is its own package so that importing the test
// harness does not pull goleak into other modules.
package leakcheck

import (
	"fmt"
	"net/http"

	"go.uber.org/goleak"
)

// Find reports the goroutines still running once a package's tests
// are done (call it from TestMain after m.Run). The test process's own
// keep-alive connections from http.DefaultClient are closed first: they
// belong to the tests, not to the code under test.
//
// A few goroutines of fasthttp are not counted, because fasthttp offers no
// way to stop or wake them:
//   - a stopped server's worker-pool cleaner and an emptied client's
//     connection cleaners each sleep up to 10 s (MaxIdleWorkerDuration,
//     MaxIdleConnDuration) before they notice and return;
//   - the Date header's clock and the default dialer's DNS cache cleaner
//     are process-wide singletons, started once and never stopped.
//
// Whatever else a fasthttp server or client leaks (Serve itself, a
// connection) still counts.
//
// Nor are two kinds of goroutine of toxiproxy, the fault-injection proxy
// of the tests (internal/faults), which it leaves blocked for good when a
// proxy is stopped (faults.Net's Cut or Close) while bytes flow through
// it: the link's writer quits on its first failed write and nothing reads
// the link's channels after that, so the toxics' stubs (ToxicStub.Run)
// and the link's reader (blocked in ChanWriter.Write) wait forever to hand
// on what they hold (TestCutMidStreamLeavesToxiproxysStubs in
// internal/faults). A proxy left running still counts: its listener's
// accept loop, its links' writers and its readers waiting on a socket.
func Find(extra ...goleak.Option) error {
	http.DefaultClient.CloseIdleConnections()
	opts := append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreTopFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	}, extra...)
	if err := goleak.Find(opts...); err != nil {
		return fmt.Errorf("goroutines outlived the tests: %w", err)
	}
	return nil
}
