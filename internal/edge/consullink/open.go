package consullink

import (
	"context"
	"log/slog"
	"os"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// Open is the edge's link to the Consul agent cfg names (nil without
// --consul), built before the parts that read their documents through it
// (Doc): the agent's client, and the rules cache (--rules-cache, else
// defaultCache under stateDir; none, logged, when no directory will do).
// Start hands it the parts; Close closes the agent's connections.
func Open(cfg config.Config, m Metrics, stateDir string, log *slog.Logger) (*Link, error) {
	if cfg.Consul == "" {
		return nil, nil
	}
	client, closeIdle, err := dial(agent{
		Addr: cfg.Consul, Token: cfg.ConsulToken, CAFile: cfg.ConsulCAFile, CertFile: cfg.ConsulCert, KeyFile: cfg.ConsulKey,
	}, cfg.ConsulPrefix)
	if err != nil {
		return nil, err
	}
	cache := cfg.RulesCache
	if cache == "" {
		var err error
		if cache, err = defaultCache(cfg.Region, stateDir, os.Getenv, os.UserCacheDir); err != nil {
			log.Warn("no directory for the rules cache: a restart while consul is unreachable enforces nothing; set --rules-cache", "err", err)
		}
	}
	l := New(Config{Client: client, Region: cfg.Region, PoP: cfg.PoP, CachePath: cache, Log: log, Metrics: m})
	l.cfg, l.closeIdle = cfg, closeIdle
	return l, nil
}

// Start hands an opened link the edge's parts and its bound addresses
// (public, admin, and the rate limit service's, "" off), which its
// registrations give; consulTickets says the session-ticket keys are the
// region's, which this edge then rotates every --tls-ticket-rotation. It
// then reads, before the first request, the enforcement switch, the
// parts' documents (Parts.Reads) and the rules, each from its cache when
// Consul cannot give it.
func (l *Link) Start(ctx context.Context, p Parts, public, admin, rls string, consulTickets bool) {
	l.parts = p
	l.reg, l.rlsReg = registrations(addrs{
		Region: l.cfg.Region, PoP: l.cfg.PoP, Advertise: l.cfg.Advertise,
		Public: public, Admin: admin, RLS: rls, RLSTLS: l.cfg.RLS.TLSCert != "",
		Version: buildinfo.Get().Version,
	})
	if consulTickets {
		l.rotation = l.cfg.TLSTicketRotation
	}
	l.ReadEnforcement(ctx)
	for _, read := range p.Reads {
		read(ctx, l.client)
	}
	l.ReadRules(ctx)
}

// Client is the client of the region's documents.
func (l *Link) Client() *region.Client { return l.client }

// Close closes the agent's connections (and their goroutines); nothing
// for a nil link.
func (l *Link) Close() {
	if l != nil && l.closeIdle != nil {
		l.closeIdle()
	}
}

// caches are the files, beside the rules cache, of the documents the
// edge's parts read themselves (Doc).
var caches = map[string]string{DocHosts: ".hosts.yaml", DocRLS: ".rls.json"}

// Doc is one of the region's documents a part of the edge reads itself
// (the host table, the rate limit service's documents, the region
// catalog): its missing flag and its file beside the rules cache. A nil
// link's records nothing and keeps no file.
type Doc struct {
	l    *Link
	name string
}

// Doc is the document named name (DocHosts, DocRLS, DocCatalog).
func (l *Link) Doc(name string) Doc { return Doc{l, name} }

// Missing marks the document missing in Consul, or back; it reports
// whether that changed.
func (d Doc) Missing(missing bool) bool { return d.l.SetMissing(d.name, missing) }

// Cache is the file keeping the last good document ("" none).
func (d Doc) Cache() string {
	if suffix := caches[d.name]; suffix != "" {
		return d.l.Beside(suffix)
	}
	return ""
}

// Keep replaces Cache with data whole.
func (d Doc) Keep(data []byte) error { return WriteFileAtomic(d.Cache(), data) }

// Changed has the edge registered again.
func (d Doc) Changed() { d.l.RulesChanged() }

// switchInForce is the enforcement switch in force, for the log.
func (l *Link) switchInForce() string {
	en, _ := l.parts.Switch.Enforcement()
	return en.String()
}
