package listen

import (
	"context"

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
