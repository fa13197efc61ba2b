package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// consulLink is the edge's side of Consul: it watches the region's rules and
// shedder documents, keeps the last good rules on disk, registers the edge
// (with the rules version it runs) and counts the region's healthy edges for
// the fallback's divisors. Consul being down never stops the edge: it keeps
// enforcing the last good rules and retries with backoff.
type consulLink struct {
	e         *Edge
	client    *region.Client
	cachePath string
	reg       region.Registration
	rlsReg    *region.RLSRegistration // with --rls-listen: its own service
	changed   chan struct{}           // the rules version changed: re-register
	missing   *missingDocs

	// Which rules documents the rules in force came from (global,
	// region): one of them absent since is missing, not a clear. Only
	// the goroutine applying the rules (readFirst, then the watch) uses
	// it, as shedderFromConsul.
	hadRules              [2]bool
	shedderFromConsul     bool // the shedder settings in force came from Consul
	enforcementFromConsul bool // so did the switch (or from its cache)
}

// setMissing is missingDocs.set, for callers whose edge may have no
// Consul link (nil: nothing is recorded).
func (l *consulLink) setMissing(doc string, missing bool) bool {
	if l == nil {
		return false
	}
	return l.missing.set(doc, missing)
}

// missingDetail is readiness's line on missing documents ("" for none).
func (l *consulLink) missingDetail() string {
	if l == nil {
		return ""
	}
	return l.missing.detail()
}

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
	l := e.newConsulLink(client, cache)
	e.consul = l

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if e.certs != nil {
		e.readConsulCerts(ctx, client)
	}
	if e.consulTickets() {
		e.readConsulTicketKeys(ctx, client)
	}
	if len(e.cfg.ACMEDomains) > 0 {
		if err := e.startACME(client); err != nil {
			return fmt.Errorf("starting ACME: %w", err)
		}
	}
	l.readFirst(ctx)
	return nil
}

// newConsulLink is the edge's link to its region in Consul, with the
// registrations of the edge and of its rate limit service.
func (e *Edge) newConsulLink(client *region.Client, cache string) *consulLink {
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
	l := &consulLink{
		e:         e,
		client:    client,
		cachePath: cache,
		changed:   make(chan struct{}, 1),
		missing:   newMissingDocs(e.metrics.consulMissing),
		reg: region.Registration{
			ID:       fmt.Sprintf("edge-%s-%s-%s-%s", e.cfg.Region, e.cfg.PoP, host, port),
			Region:   e.cfg.Region,
			PoP:      e.cfg.PoP,
			Address:  advertise,
			Port:     portNum,
			CheckURL: "http://" + localAddr(e.AdminAddr()) + "/readyz",
		},
	}
	if e.rls != nil {
		_, rlsPort, _ := net.SplitHostPort(e.RLSAddr())
		rlsPortNum, _ := strconv.Atoi(rlsPort)
		_, adminPort, _ := net.SplitHostPort(e.AdminAddr())
		adminPortNum, _ := strconv.Atoi(adminPort)
		l.rlsReg = &region.RLSRegistration{
			ID:          fmt.Sprintf("rls-%s-%s-%s-%s", e.cfg.Region, e.cfg.PoP, host, rlsPort),
			Region:      e.cfg.Region,
			PoP:         e.cfg.PoP,
			Edge:        l.reg.ID,
			Address:     advertise,
			Port:        rlsPortNum,
			MetricsPort: adminPortNum,
			CheckAddr:   localAddr(e.RLSAddr()),
			TLS:         e.cfg.RLS.TLSCert != "",
		}
	}
	return l
}

// readFirst reads, before the first request, what the watch would:
// the enforcement switch, the rate limit service's documents and the
// rules, each from the cache when Consul cannot give it.
func (l *consulLink) readFirst(ctx context.Context) {
	e, client := l.e, l.client
	// The switch before the first request: an edge restarted while its
	// region runs in shadow must not enforce until the watch starts — nor
	// while Consul is unreachable: then the cached switch applies.
	if data, _, err := client.Get(ctx, e.cfg.Region, client.Layout().Enforcement(e.cfg.Region)); err == nil {
		// None in Consul: the one this edge last ran, if it kept one (a
		// Consul rebuilt empty must not change the region's switch).
		cached := false
		if !hasText(data) {
			cached, _ = l.loadEnforcementCache()
		}
		if cached {
			l.missing.set(docEnforcement, true)
			e.log.Warn("no enforcement switch in consul at start; running the cached one until one is pushed", "key", client.Layout().Enforcement(e.cfg.Region), "switch", e.enforce.Load().String())
		} else if err := l.applyEnforcement(data); err != nil {
			e.metrics.rulesErrors.Inc()
			e.log.Error("enforcement switch from consul refused; enforcing every key", "err", err)
		}
	} else if _, cerr := l.loadEnforcementCache(); cerr != nil {
		e.log.Warn("no enforcement switch from consul nor from the cache: enforcing every key", "err", err, "cache_err", cerr)
	}
	// The rate limit service's documents likewise: the watch reads them
	// once Consul answers; until then, the cached ones.
	if e.rlsFromConsul() {
		if _, err := client.ReadRLS(ctx, e.cfg.Region); err != nil {
			if cerr := e.loadRLSCache(client.Layout().RLS(e.cfg.Region)); cerr != nil {
				e.log.Warn("no rate limit service documents from consul nor from the cache: answering UNAVAILABLE until consul does", "err", err, "cache_err", cerr)
			}
		}
	}
	err := region.Recover(func() error {
		docs, err := client.ReadDocs(ctx, e.cfg.Region)
		if err == nil && !hasText(docs.Global) && !hasText(docs.Region) && l.loadCache() == nil {
			// No rules document in Consul, but rules on disk: the region's
			// last rules, kept as if this edge had run on.
			l.missing.set(docRules, true)
			e.log.Warn("no rules documents in consul at start; enforcing the cached rules until one is pushed", "version", e.rules.Load().Version(), "cache", l.cachePath,
				"global", client.Layout().GlobalRules(), "region", client.Layout().RegionRules(e.cfg.Region))
			return nil
		}
		if err == nil {
			err = l.applyDocs(docs)
		}
		return err
	})
	if err != nil {
		l.countPanic(err)
		e.log.Warn("no valid rules from consul at start; enforcing the cached rules", "err", err, "cache", l.cachePath)
		if cerr := l.loadCache(); cerr != nil {
			e.log.Error("no cached rules either: nothing is limited and /readyz stays 503 until consul answers", "err", cerr)
		}
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

// hasText says whether a document holds anything: an absent key, or one
// holding only white space, is no document.
func hasText(data []byte) bool { return len(bytes.TrimSpace(data)) > 0 }

// applyDocs merges the region's documents and swaps them in; the last good
// rules are written to the cache. A document missing where the rules in
// force had one keeps those rules (keepRules).
func (l *consulLink) applyDocs(docs region.Docs) error {
	if l.keepRules(docs) {
		return nil
	}
	snap, doc, err := rules.Effective(docs.Global, docs.Region, l.e.compileOptions()...)
	if err := l.e.applySnapshot(snap, err); err != nil {
		return fmt.Errorf("rules from consul refused: %w", err)
	}
	l.hadRules = [2]bool{hasText(docs.Global), hasText(docs.Region)}
	if l.missing.set(docRules, false) {
		l.e.log.Info("rules documents are back in consul; the missing document alert clears", "version", snap.Version())
	}
	if l.cachePath == "" {
		return nil
	}
	data, err := rules.Marshal(doc) // yaml.Marshal takes tens of seconds over 100,000 rules
	if err == nil {
		err = writeFileAtomic(l.cachePath, data)
	}
	if err != nil {
		l.e.log.Warn("could not cache rules", "path", l.cachePath, "err", err)
	}
	return nil
}

// keepRules says whether docs lack a rules document the edge's rules need:
// none at all, or one the rules in force came from. Then the rules in force
// stay and the document counts as missing. An edge without rules yet takes
// what there is, as before.
func (l *consulLink) keepRules(docs region.Docs) bool {
	snap := l.e.rules.Load()
	has := [2]bool{hasText(docs.Global), hasText(docs.Region)}
	gone := !has[0] && !has[1] || l.hadRules[0] && !has[0] || l.hadRules[1] && !has[1]
	if snap == nil || !gone {
		return false
	}
	if l.missing.set(docRules, true) {
		layout := l.client.Layout()
		var absent []string
		for i, key := range []string{layout.GlobalRules(), layout.RegionRules(l.e.cfg.Region)} {
			if !has[i] {
				absent = append(absent, key)
			}
		}
		l.e.log.Warn("rules documents missing in consul; keeping the rules in force (an explicit document, rules: [], clears them)",
			"absent", strings.Join(absent, ","), "version", snap.Version(), "rules", len(snap.Rules()))
	}
	return true
}

func (l *consulLink) loadCache() error {
	if l.cachePath == "" {
		return errors.New("no rules cache")
	}
	data, err := os.ReadFile(l.cachePath)
	if err != nil {
		return err
	}
	return l.e.ApplyRules(data)
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".rules-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (l *consulLink) rulesChanged(string) {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// run watches and registers until ctx is done, and returns once every
// goroutine it started has.
func (l *consulLink) run(ctx context.Context) {
	e := l.e
	onErr := func(err error) {
		var refused *region.RefusedError
		switch {
		case l.countPanic(err):
		case errors.As(err, &refused):
			e.metrics.rulesErrors.Inc()
			e.log.Error("rules from consul refused; keeping the rules in force", "err", err, "version", e.rules.Load().Version())
		default:
			e.metrics.consulErrors.Inc()
			e.log.Warn("consul watch failed; keeping the settings in force", "err", err)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		l.client.WatchRules(ctx, e.cfg.Region, func(d region.Docs) {
			if err := l.applyDocs(d); err != nil {
				e.log.Error("rules from consul refused; keeping the rules in force", "err", err, "version", e.rules.Load().Version())
			}
		}, onErr)
	})
	wg.Go(func() {
		l.client.WatchEnforcement(ctx, e.cfg.Region, func(data []byte) {
			if err := l.applyEnforcement(data); err != nil {
				e.metrics.rulesErrors.Inc()
				e.log.Error("enforcement switch from consul refused; keeping the switch in force", "err", err)
			}
		}, onErr)
	})
	if e.global != nil {
		wg.Go(func() { e.global.watch(ctx, l.client, onErr) })
	}
	wg.Go(func() {
		l.client.WatchShedder(ctx, e.cfg.Region, func(data []byte) {
			if err := l.applyShedder(data); err != nil {
				e.metrics.rulesErrors.Inc()
				e.log.Error("shedder settings from consul refused; keeping the settings in force", "err", err)
			}
		}, onErr)
	})
	if e.rlsFromConsul() {
		prefix := l.client.Layout().RLS(e.cfg.Region)
		wg.Go(func() {
			l.client.WatchRLS(ctx, e.cfg.Region, func(docs map[string][]byte) { e.applyConsulRLS(prefix, docs) }, onErr)
		})
	}
	if e.certs != nil {
		wg.Go(func() { l.client.WatchCerts(ctx, e.cfg.Region, e.applyConsulCerts, onErr) })
	}
	if e.consulTickets() {
		wg.Go(func() { l.client.WatchTicketKeys(ctx, e.cfg.Region, e.applyConsulTicketKeys, onErr) })
		if e.cfg.TLSTicketRotation > 0 {
			wg.Go(func() { l.guard(ctx, "rotating session ticket keys", l.rotateTicketKeys) })
		}
	}
	wg.Go(func() { l.guard(ctx, "counting edges", l.countEdges) })
	l.guard(ctx, "registering", l.register)
}

// countPanic logs and counts err when it is a recovered panic, and says
// whether it was.
func (l *consulLink) countPanic(err error) bool {
	var p *region.PanicError
	if !errors.As(err, &p) {
		return false
	}
	l.e.metrics.consulPanics.Inc()
	l.e.log.Error("panic in the consul watchers recovered; keeping the settings in force", "err", err, "stack", string(p.Stack))
	return true
}

// guard runs loop until ctx is done; a panic in it is recovered, logged,
// counted, and the loop started again after a pause.
func (l *consulLink) guard(ctx context.Context, what string, loop func(context.Context)) {
	for ctx.Err() == nil {
		err := region.Recover(func() error { loop(ctx); return nil })
		if !l.countPanic(err) {
			return
		}
		l.e.log.Warn("consul loop restarting after a panic", "loop", what)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// applyShedder applies the region's shedder document; none means the
// settings the edge started with, unless the settings in force came from
// Consul: then they stay, and the document counts as missing (`shedder set
// --reset` writes the defaults explicitly).
func (l *consulLink) applyShedder(data []byte) error {
	if !hasText(data) {
		if l.shedderFromConsul {
			if l.missing.set(docShedder, true) {
				l.e.log.Warn("shedder settings missing in consul; keeping the settings in force", "key", l.client.Layout().Shedder(l.e.cfg.Region))
			}
			return nil
		}
		if l.e.cfg.Shedder != "" {
			return l.e.loadShedder()
		}
		return l.e.shed.Update(shedder.DefaultConfig())
	}
	cfg, err := shedder.ParseConfig(data)
	if err != nil {
		return err
	}
	if err := l.e.shed.Update(cfg); err != nil {
		return err
	}
	l.shedderFromConsul = true
	l.missing.set(docShedder, false)
	l.e.log.Info("shedder settings from consul applied", "good", cfg.Good, "bad", cfg.Bad, "start_after", cfg.StartAfter, "full_after", cfg.FullAfter, "enabled", cfg.Enabled)
	return nil
}

// register keeps the catalog entry current: at start, whenever the rules
// version changes, and again after a failure.
func (l *consulLink) register(ctx context.Context) {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.changed:
		case <-retry.C:
		}
		l.reg.RulesVersion = l.e.rules.Load().Version()
		l.reg.GlobalShare = l.e.global.unreachable()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.client.Register(rctx, l.reg)
		if err == nil && l.rlsReg != nil {
			err = l.client.RegisterRLS(rctx, *l.rlsReg)
		}
		cancel()
		if err != nil {
			l.e.metrics.consulErrors.Inc()
			l.e.log.Warn("registering in consul failed; retrying", "err", err)
			retry.Reset(5 * time.Second)
		}
	}
}

func (l *consulLink) deregister() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.client.Deregister(ctx, l.reg.ID); err != nil {
		l.e.log.Warn("deregistering from consul failed", "err", err)
	}
	if l.rlsReg != nil {
		if err := l.client.Deregister(ctx, l.rlsReg.ID); err != nil {
			l.e.log.Warn("deregistering the rate limit service from consul failed", "err", err)
		}
	}
}

// countEdges follows the region's healthy edges (a blocking query) and sets
// the fallback's divisors: the local share of a limit when Redis is down.
func (l *consulLink) countEdges(ctx context.Context) {
	var index uint64
	wait := time.Second
	for ctx.Err() == nil {
		edges, next, err := l.client.Edges(ctx, l.e.cfg.Region, index, 5*time.Minute)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
			index = 0
			continue
		}
		wait = time.Second
		index = next
		inRegion, inPoP := region.Count(edges, l.e.cfg.Region, l.e.cfg.PoP)
		l.e.nodesRegion.Store(int64(max(inRegion, 1)))
		l.e.nodesPoP.Store(int64(max(inPoP, 1)))
		l.e.shed.SetEdges(inRegion)
	}
}
