package edge

import (
	"context"
	"time"

	"github.com/edgeguard/edgeguard/internal/edge/consullink"
)

// startConsul hands the Consul link the parts it reads and feeds, and
// loads the first documents before the first request: the certificates,
// the enforcement switch, the rate limit service's documents, the host
// table and the rules, each from its cache when Consul cannot give it or
// holds an invalid one. Run starts the watches. Nothing without --consul.
func (e *Edge) startConsul() error {
	if e.consul == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stop, err := e.front.TLS.StartConsul(ctx, e.consul.Client()) // certificates, ticket keys, ACME
	if stop != nil {
		e.closers = append(e.closers, stop)
	}
	if err != nil {
		return err
	}
	region, certs, hosts := e.cfg.Region, e.front.TLS.Certificates(), e.consul.Doc(consullink.DocHosts)
	p := consullink.Parts{
		Rules: e.rules, Switch: e.pipe, Shedder: e.shed, Hosts: e.origins.Router, Global: e.global, SetEdges: e.setEdges,
		Watches: append(certs.ConsulWatches(region), e.origins.Router.WatchConsul(region, e.cfg.PoP, hosts)),
	}
	if e.global != nil {
		p.Watches = append(p.Watches, e.global.Watch)
	}
	if rls := e.consul.Doc(consullink.DocRLS); e.rls.FromConsul() {
		p.Reads = append(p.Reads, e.rls.ReadConsul(region, rls))
		p.Watches = append(p.Watches, e.rls.WatchConsul(region, rls))
	}
	p.Reads = append(p.Reads, e.origins.Router.ReadRegion(region, hosts))
	e.consul.Start(ctx, p, e.Addr(), e.AdminAddr(), e.RLSAddr(), certs.ConsulTickets())
	return nil
}

// setEdges sets the fallback's divisors and the shedder's share of the
// adaptive limit from the region's healthy edges (Consul's count).
func (e *Edge) setEdges(inRegion, inPoP int) {
	e.nodesRegion.Store(int64(max(inRegion, 1)))
	e.nodesPoP.Store(int64(max(inPoP, 1)))
	e.shed.SetEdges(inRegion)
}

// stateDir is the system-wide state directory tried after $STATE_DIRECTORY.
var stateDir = "/var/lib/edgeguard"
