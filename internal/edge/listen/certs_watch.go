package listen

import (
	"context"
	"fmt"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// ReadConsulAll reads the region's certificates and, when they are the
// region's (ConsulTickets), its session-ticket keys, before the first
// request. Nothing without certificates (nil).
func (e *Certs) ReadConsulAll(ctx context.Context, client *region.Client) {
	if e == nil {
		return
	}
	e.ReadConsul(ctx, client)
	if e.ConsulTickets() {
		e.ReadConsulTicketKeys(ctx, client)
	}
}

// ConsulWatches are the watches of the region's certificates and, when
// they are the region's, its session-ticket keys; none without
// certificates (nil).
func (e *Certs) ConsulWatches(reg string) []func(ctx context.Context, client *region.Client, onErr func(error)) {
	if e == nil {
		return nil
	}
	w := []func(ctx context.Context, client *region.Client, onErr func(error)){
		func(ctx context.Context, client *region.Client, onErr func(error)) {
			client.WatchCerts(ctx, reg, e.ApplyConsul, onErr)
		},
	}
	if e.ConsulTickets() {
		w = append(w, func(ctx context.Context, client *region.Client, onErr func(error)) {
			client.WatchTicketKeys(ctx, reg, e.ApplyConsulTicketKeys, onErr)
		})
	}
	return w
}

// StartConsul reads the region's certificates and ticket keys
// (ReadConsulAll) before the first request, and starts ACME for
// --acme-domains, answering challenges on this listener; stop ends ACME
// (nil when none started). Nothing for a nil TLS.
func (t *TLS) StartConsul(ctx context.Context, client *region.Client) (stop func(), err error) {
	if t == nil {
		return nil, nil
	}
	t.Certs.ReadConsulAll(ctx, client)
	if len(t.Certs.cfg.ACMEDomains) == 0 {
		return nil, nil
	}
	if stop, err = t.Certs.StartACME(client, t.Addr()); err != nil {
		err = fmt.Errorf("starting ACME: %w", err)
	}
	return stop, err
}
