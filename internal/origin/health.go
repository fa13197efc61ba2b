package origin

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

const checkUserAgent = "edgeguard-origin-check"

// checkLoop probes every origin at HealthCheckInterval until Close. The
// first round runs at once so a dead origin leaves rotation before real
// traffic has to discover it.
func (p *Proxy) checkLoop() {
	defer p.checkDone.Done()
	t := time.NewTicker(p.cfg.HealthCheckInterval)
	defer t.Stop()
	for {
		p.checkAll()
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

// checkAll probes the origins in parallel so one hanging origin cannot
// delay the verdict on the others; the ticker drops the ticks a slow round
// overlaps, so rounds never pile up.
func (p *Proxy) checkAll() {
	var wg sync.WaitGroup
	for _, o := range p.origins {
		wg.Go(func() {
			if err := p.check(o); err != nil {
				p.failed(o, "check")
				p.log.Debug("origin check failed", "origin", o.url, "err", err)
				return
			}
			p.succeeded(o, "check")
		})
	}
	wg.Wait()
}

// errUnhealthyStatus is a check answered with a 5xx.
var errUnhealthyStatus = errors.New("origin answered with a server error")

// check sends one GET to HealthCheckPath. Its timeout is the shorter of the
// header timeout and the interval, so a check never outlives its round.
func (p *Proxy) check(o *origin) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI(o.scheme + "://" + o.host + p.cfg.HealthCheckPath)
	req.Header.SetUserAgent(checkUserAgent)

	timeout := min(p.cfg.HeaderTimeout, p.cfg.HealthCheckInterval)
	if err := o.client.DoTimeout(req, resp, timeout); err != nil {
		return fmt.Errorf("checking %s: %w", o.url, err)
	}
	if code := resp.StatusCode(); code >= 500 {
		return fmt.Errorf("checking %s: status %d: %w", o.url, code, errUnhealthyStatus)
	}
	return nil
}
