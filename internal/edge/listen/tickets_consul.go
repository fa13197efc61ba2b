package listen

import (
	"context"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// Session-ticket keys from Consul (ticket-keys/<region>, see pkg/region):
// with --consul and --listen-tls, and no --tls-ticket-keys file, every edge
// of the region encrypts its tickets with the region's first key and
// decrypts with all of them, so a client resumes on any edge of the region.
// Every --tls-ticket-rotation one edge rotates them: each edge checks at
// ticketRotationCheck, and a check-and-set on the value read lets exactly
// one write a rotation that is due (the others find it done). Until the
// keys exist each edge uses its own (crypto/tls's default).

// ConsulTickets says whether the session-ticket keys come from Consul.
func (e *Certs) ConsulTickets() bool {
	if e == nil {
		return false
	}
	return e.tlsConfig != nil && e.tickets == nil && e.cfg.Consul != ""
}

// ReadConsulTicketKeys applies the region's keys once, at start.
func (e *Certs) ReadConsulTicketKeys(ctx context.Context, client *region.Client) {
	t, index, err := client.ReadTicketKeys(ctx, e.cfg.Region)
	switch {
	case err != nil:
		e.log.Warn("session ticket keys in consul not read at start; this edge's own keys until consul answers", "err", err)
	case index != 0:
		e.setTicketKeys(t)
	}
}

// ApplyConsulTicketKeys applies the stored document (nil: none yet). An
// invalid one is refused and the keys in force stay.
func (e *Certs) ApplyConsulTicketKeys(data []byte) {
	if data == nil {
		e.log.Info("no session ticket keys in consul yet; this edge's own keys until there are", "key", region.NewLayout(e.cfg.ConsulPrefix).TicketKeys(e.cfg.Region))
		return
	}
	t, err := region.ParseTicketKeys(data)
	if err != nil {
		e.m.refusedFiles.Inc()
		e.log.Error("session ticket keys from consul refused; keeping the keys in force", "key", region.NewLayout(e.cfg.ConsulPrefix).TicketKeys(e.cfg.Region), "reason", err)
		return
	}
	e.setTicketKeys(t)
}

func (e *Certs) setTicketKeys(t region.TicketKeys) {
	e.tlsConfig.SetSessionTicketKeys(t.Keys)
	e.m.ticketsAt.Set(float64(t.Rotated.Unix()))
	e.log.Info("session ticket keys loaded from consul", "keys", len(t.Keys), "rotated", t.Rotated)
}
