package edge

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/hostroute"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

func consulConfig(c config.Config) *api.Config {
	cfg := api.DefaultConfig()
	addr := c.Consul
	if rest, ok := strings.CutPrefix(addr, "https://"); ok {
		cfg.Scheme, addr = "https", rest
	}
	cfg.Address = strings.TrimPrefix(addr, "http://")
	if c.ConsulToken != "" {
		// Otherwise the api's defaults stand: CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE.
		cfg.Token = c.ConsulToken
	}
	cfg.TLSConfig = api.TLSConfig{CAFile: c.ConsulCAFile, CertFile: c.ConsulCert, KeyFile: c.ConsulKey}
	return cfg
}

// startConsul loads the first rules — from Consul, or from the cache when
// Consul is unreachable or holds an invalid document — and prepares the
// watches that Run starts.
func (e *Edge) startConsul() error {
	ccfg := consulConfig(e.cfg)
	client, err := region.NewClient(ccfg, e.cfg.ConsulPrefix)
	if err != nil {
		return err
	}
	// The agent's keep-alive connections (and their goroutines) go with the edge.
	e.closers = append(e.closers, ccfg.Transport.CloseIdleConnections)
	cache := e.cfg.RulesCache
	if cache == "" {
		var err error
		if cache, err = defaultRulesCache(e.cfg.Region, os.Getenv, os.UserCacheDir); err != nil {
			e.log.Warn("no directory for the rules cache: a restart while consul is unreachable enforces nothing; set --rules-cache", "err", err)
		}
	}
	l := consullink.New(e.consulLinkConfig(client, cache))
	e.consul = l

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if e.certs != nil {
		e.certs.ReadConsul(ctx, client)
	}
	if e.certs.ConsulTickets() {
		e.certs.ReadConsulTicketKeys(ctx, client)
	}
	if len(e.cfg.ACMEDomains) > 0 {
		stop, err := e.certs.StartACME(client, e.TLSAddr())
		if stop != nil {
			e.closers = append(e.closers, stop)
		}
		if err != nil {
			return fmt.Errorf("starting ACME: %w", err)
		}
	}
	// What the watches would read, before the first request: the
	// enforcement switch, the rate limit service's documents, the host
	// table and the rules,
	// each from the cache when Consul cannot give it.
	l.ReadEnforcement(ctx)
	if e.rlsFromConsul() {
		if _, err := client.ReadRLS(ctx, e.cfg.Region); err != nil {
			if cerr := e.rls.LoadCache(client.Layout().RLS(e.cfg.Region), e.rlsConsul()); cerr != nil {
				e.log.Warn("no rate limit service documents from consul nor from the cache: answering UNAVAILABLE until consul does", "err", err, "cache_err", cerr)
			}
		}
	}
	e.router.ReadConsul(ctx, func(ctx context.Context) ([]byte, error) {
		doc, _, err := client.Hosts(ctx, e.cfg.Region)
		return doc, err
	}, e.hostsConsul())
	l.ReadRules(ctx)
	return nil
}

// consulLinkConfig is the edge's link to its region in Consul: the
// registrations of the edge and of its rate limit service, and the parts
// the link reads and feeds.
func (e *Edge) consulLinkConfig(client *region.Client, cache string) consullink.Config {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(e.Addr())
	portNum, _ := strconv.Atoi(port)
	advertise := ""
	if e.cfg.Advertise != "" {
		advertise, _, _ = strings.Cut(e.cfg.Advertise, ":")
		// Edges sharing a host (and a port, each on its own address) must
		// not share a service ID: the second would replace the first.
		host = advertise
	}
	c := consullink.Config{
		Client:    client,
		Region:    e.cfg.Region,
		PoP:       e.cfg.PoP,
		CachePath: cache,
		Log:       e.log,
		Metrics: consullink.Metrics{
			Errors:      e.metrics.consulErrors,
			Panics:      e.metrics.consulPanics,
			RulesErrors: e.metrics.rulesErrors,
			Missing:     e.metrics.consulMissing,
		},
		Parts: e.consulParts(),
		Reg: region.Registration{
			ID:       fmt.Sprintf("edge-%s-%s-%s-%s", e.cfg.Region, e.cfg.PoP, host, port),
			Region:   e.cfg.Region,
			PoP:      e.cfg.PoP,
			Address:  advertise,
			Port:     portNum,
			Version:  buildinfo.Get().Version,
			CheckURL: "http://" + localAddr(e.AdminAddr()) + "/readyz",
		},
	}
	if e.rls != nil {
		_, rlsPort, _ := net.SplitHostPort(e.RLSAddr())
		rlsPortNum, _ := strconv.Atoi(rlsPort)
		_, adminPort, _ := net.SplitHostPort(e.AdminAddr())
		adminPortNum, _ := strconv.Atoi(adminPort)
		c.RLSReg = &region.RLSRegistration{
			ID:          fmt.Sprintf("rls-%s-%s-%s-%s", e.cfg.Region, e.cfg.PoP, host, rlsPort),
			Region:      e.cfg.Region,
			PoP:         e.cfg.PoP,
			Edge:        c.Reg.ID,
			Address:     advertise,
			Port:        rlsPortNum,
			MetricsPort: adminPortNum,
			CheckAddr:   localAddr(e.RLSAddr()),
			TLS:         e.cfg.RLS.TLSCert != "",
		}
	}
	if e.certs.ConsulTickets() {
		c.TicketRotation = e.cfg.TLSTicketRotation
	}
	return c
}

// consulParts are the edge's parts the Consul link reads and feeds.
func (e *Edge) consulParts() consullink.Parts {
	p := consullink.Parts{
		Rules:          e.rules.Load,
		CompileOptions: e.cfg.CompileOptions,
		ApplySnapshot:  e.applySnapshot,
		ApplyRules:     e.ApplyRules,
		Enforcement:    func() string { en, _ := e.pipe.Enforcement(); return en.String() },
		SetEnforcement: e.pipe.SetEnforcement,
		UpdateShedder:  e.shed.Update,
		StartShedder: func() error {
			if e.cfg.Shedder != "" {
				return e.loadShedder()
			}
			return e.shed.Update(shedder.DefaultConfig())
		},
		ShedderVersion: func() string { return shedder.SettingsVersion(e.shed.Config()) },
		HostsVersion:   e.router.Version,
		SetEdges: func(inRegion, inPoP int) {
			e.nodesRegion.Store(int64(max(inRegion, 1)))
			e.nodesPoP.Store(int64(max(inPoP, 1)))
			e.shed.SetEdges(inRegion)
		},
		GlobalShare: func() []string { return e.global.Unreachable() },
	}
	if e.global != nil {
		p.Watches = append(p.Watches, e.global.Watch)
	}
	if e.rlsFromConsul() {
		p.Watches = append(p.Watches, func(ctx context.Context, client *region.Client, onErr func(error)) {
			prefix := client.Layout().RLS(e.cfg.Region)
			rc := e.rlsConsul()
			client.WatchRLS(ctx, e.cfg.Region, func(docs map[string][]byte) { e.rls.ApplyConsul(prefix, docs, rc) }, onErr)
		})
	}
	p.Watches = append(p.Watches, func(ctx context.Context, client *region.Client, onErr func(error)) {
		client.WatchPoPHosts(ctx, e.cfg.Region, e.cfg.PoP, func(doc []byte, _ uint64, canary bool) {
			e.router.ApplyConsul(doc, canary, e.hostsConsul())
			e.consul.RulesChanged() // the host table version is registered too
		}, onErr)
	})
	if e.certs != nil {
		p.Watches = append(p.Watches, func(ctx context.Context, client *region.Client, onErr func(error)) {
			client.WatchCerts(ctx, e.cfg.Region, e.certs.ApplyConsul, onErr)
		})
	}
	if e.certs.ConsulTickets() {
		p.Watches = append(p.Watches, func(ctx context.Context, client *region.Client, onErr func(error)) {
			client.WatchTicketKeys(ctx, e.cfg.Region, e.certs.ApplyConsulTicketKeys, onErr)
		})
	}
	return p
}

// hostsConsul is what the host table needs of the Consul link (package
// hostroute): its missing document, and the cache beside the rules cache.
func (e *Edge) hostsConsul() hostroute.Consul {
	return hostroute.Consul{
		Missing:   func(missing bool) bool { return e.consul.SetMissing(consullink.DocHosts, missing) },
		Cache:     e.consul.Beside(".hosts.yaml"),
		WriteFile: consullink.WriteFileAtomic,
	}
}

// stateDir is the system-wide state directory tried after $STATE_DIRECTORY.
var stateDir = "/var/lib/edgeguard"

// defaultRulesCache is where the last good rules are kept when
// --rules-cache is not set, the first that applies of:
//
//  1. $STATE_DIRECTORY (the first of its paths): systemd sets it for a unit
//     with StateDirectory=edgeguard;
//  2. /var/lib/edgeguard, when the edge may write there;
//  3. the user cache dir (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache),
//     under edgeguard/.
//
// The file is rules-<region>.yaml. Never the temporary directory: anyone
// may write there and a reboot empties it, so a restarted edge would run
// what someone else left, or nothing. With none of them, there is no cache
// (an error says so).
func defaultRulesCache(region string, getenv func(string) string, userCache func() (string, error)) (string, error) {
	name := "rules-" + region + ".yaml"
	if dirs := getenv("STATE_DIRECTORY"); dirs != "" {
		dir, _, _ := strings.Cut(dirs, ":")
		return filepath.Join(dir, name), nil
	}
	if writableDir(stateDir) {
		return filepath.Join(stateDir, name), nil
	}
	dir, err := userCache()
	if err != nil {
		return "", fmt.Errorf("finding the rules cache: no $STATE_DIRECTORY, %s not writable, no user cache dir: %w", stateDir, err)
	}
	return filepath.Join(dir, "edgeguard", name), nil
}

// writableDir reports whether dir exists, or can be made, and takes files.
func writableDir(dir string) bool {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}

// localAddr turns a wildcard bind address into one the local agent can dial.
func localAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
