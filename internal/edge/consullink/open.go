package consullink

import (
	"log/slog"
	"os"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Options are what Open needs beside the settings: the edge's bound
// addresses, which its registrations give, and its parts.
type Options struct {
	Public, Admin string
	RLS           string // the rate limit service's bound address ("" off)
	// ConsulTickets says the session-ticket keys are the region's: this
	// edge then rotates them every --tls-ticket-rotation.
	ConsulTickets bool
	StateDir      string // the system-wide state directory (DefaultCache)
	Metrics       Metrics
	Parts         Parts
	Log           *slog.Logger
}

// Open dials the Consul agent cfg names and builds the edge's link to its
// region: the rules cache (--rules-cache, else DefaultCache; none, logged,
// when no directory will do) and the registrations of the edge and of its
// rate limit service. closeIdle closes the agent's connections.
func Open(cfg config.Config, o Options) (_ *Link, _ *region.Client, closeIdle func(), _ error) {
	client, closeIdle, err := Dial(Agent{
		Addr: cfg.Consul, Token: cfg.ConsulToken, CAFile: cfg.ConsulCAFile, CertFile: cfg.ConsulCert, KeyFile: cfg.ConsulKey,
	}, cfg.ConsulPrefix)
	if err != nil {
		return nil, nil, nil, err
	}
	cache := cfg.RulesCache
	if cache == "" {
		var err error
		if cache, err = DefaultCache(cfg.Region, o.StateDir, os.Getenv, os.UserCacheDir); err != nil {
			o.Log.Warn("no directory for the rules cache: a restart while consul is unreachable enforces nothing; set --rules-cache", "err", err)
		}
	}
	c := Config{
		Client:    client,
		Region:    cfg.Region,
		PoP:       cfg.PoP,
		CachePath: cache,
		Log:       o.Log,
		Metrics:   o.Metrics,
		Parts:     o.Parts,
	}
	c.Reg, c.RLSReg = Registrations(Addrs{
		Region: cfg.Region, PoP: cfg.PoP, Advertise: cfg.Advertise,
		Public: o.Public, Admin: o.Admin, RLS: o.RLS, RLSTLS: cfg.RLS.TLSCert != "",
		Version: buildinfo.Get().Version,
	})
	if o.ConsulTickets {
		c.TicketRotation = cfg.TLSTicketRotation
	}
	return New(c), client, closeIdle, nil
}
