// Package consullink is the edge's side of Consul: the region's rules,
// shedder settings and enforcement switch, watched and applied through the
// edge's parts (Parts); the last good documents kept on disk; the edge's
// registration; the region's healthy edges counted; the session-ticket
// keys rotated. What it cannot read it counts as missing and keeps the
// last good document.
package consullink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Link is the edge's side of Consul: it watches the region's rules and
// shedder documents, keeps the last good rules on disk, registers the edge
// (with the rules version it runs) and counts the region's healthy edges for
// the fallback's divisors. Consul being down never stops the edge: it keeps
// enforcing the last good rules and retries with backoff.
type Link struct {
	client    *region.Client
	region    string
	pop       string
	log       *slog.Logger
	m         Metrics
	parts     Parts
	rotation  time.Duration // --tls-ticket-rotation, when the keys are the region's; 0: none
	cachePath string
	reg       region.Registration
	rlsReg    *region.RLSRegistration // with --rls-listen: its own service
	changed   chan struct{}           // the rules version changed: re-register
	missing   *missingDocs

	// Which rules documents the rules in force came from (global,
	// region): one of them absent since is missing, not a clear. Only
	// the goroutine applying the rules (ReadRules, then the watch) uses
	// it, as shedderFromConsul.
	hadRules              [2]bool
	shedderFromConsul     bool // the shedder settings in force came from Consul
	enforcementFromConsul bool // so did the switch (or from its cache)

	cfg       config.Config // the settings Open had, for Start
	closeIdle func()        // closes the agent's connections (Close)
}

// Parts are the edge's parts the link reads and feeds.
type Parts struct {
	Rules   Rules
	Switch  Switch
	Shedder Shedder
	// Hosts is the host table, whose version is registered (nil: none).
	Hosts interface{ Version() string }
	// Global are the global rules' homes: the ones this edge cannot reach
	// are registered (nil: none).
	Global   interface{ Unreachable() []string }
	SetEdges func(inRegion, inPoP int)
	// Reads are the edge's other documents, read before the first request
	// (after the switch, before the rules), from their caches when
	// Consul cannot give them.
	Reads []Read
	// Watches are the edge's other watches (the region catalog, the rate
	// limit service's documents, the host table, certificates, ticket
	// keys), run with the link's and reporting their errors to it.
	Watches []Watch
}

// Read reads a document before the first request; Watch watches it
// until ctx is done, reporting its errors to onErr.
type (
	Read  = func(ctx context.Context, client *region.Client)
	Watch = func(ctx context.Context, client *region.Client, onErr func(error))
)

// Rules are the rules in force (package liverules).
type Rules interface {
	Load() *rules.Snapshot                      // nil: none yet
	ApplySnapshot(*rules.Snapshot, error) error // swaps compiled rules in, or counts err
	Apply([]byte) error                         // a rules document (the cache)
	CompileOptions() []rules.CompileOption
}

// Switch is the region's enforcement switch in force (package pipeline).
type Switch interface {
	Enforcement() (en region.Enforcement, ok bool)
	SetEnforcement(region.Enforcement)
}

// Shedder is the load shedder and the settings it started with.
type Shedder interface {
	Update(shedder.Config) error
	Config() shedder.Config // whose version is registered
	Start() error           // back to the settings the edge started with
}

// Metrics are the counters the link adds to.
type Metrics struct {
	Errors      prometheus.Counter   // Consul calls that failed
	Panics      prometheus.Counter   // panics recovered in the watchers
	RulesErrors prometheus.Counter   // documents refused
	Missing     *prometheus.GaugeVec // document: kept while missing in Consul
}

// NewMetrics registers the link's series with reg; rulesErrors is the
// edge's count of refused rules documents, which the link adds to.
func NewMetrics(reg prometheus.Registerer, rulesErrors prometheus.Counter) (Metrics, error) {
	m := Metrics{
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_consul_errors_total",
			Help: "Failed Consul watches and registrations (retried with backoff; the settings in force stay).",
		}),
		Panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_consul_panics_total",
			Help: "Panics recovered in the Consul watchers (a bug: see logs; the settings in force stay, the watch goes on).",
		}),
		RulesErrors: rulesErrors,
		Missing:     NewMissingGauge(),
	}
	return m, errors.Join(reg.Register(m.Errors), reg.Register(m.Panics), reg.Register(m.Missing))
}

// Config is what a link is made of.
type Config struct {
	Client    *region.Client
	Region    string
	PoP       string
	CachePath string // the last good rules; "" none
	Reg       region.Registration
	RLSReg    *region.RLSRegistration // nil without --rls-listen
	// TicketRotation is --tls-ticket-rotation when the session-ticket
	// keys are the region's; 0: this edge rotates none.
	TicketRotation time.Duration
	Log            *slog.Logger
	Metrics        Metrics
	Parts          Parts
}

// New is the edge's link to its region in Consul; ReadEnforcement and
// ReadRules read what the watches would before the first request, Run
// watches.
func New(c Config) *Link {
	return &Link{
		client:    c.Client,
		region:    c.Region,
		pop:       c.PoP,
		log:       c.Log,
		m:         c.Metrics,
		parts:     c.Parts,
		rotation:  c.TicketRotation,
		cachePath: c.CachePath,
		reg:       c.Reg,
		rlsReg:    c.RLSReg,
		changed:   make(chan struct{}, 1),
		missing:   newMissingDocs(c.Metrics.Missing),
	}
}

// SetMissing is missingDocs.set, for callers whose edge may have no
// Consul link (nil: nothing is recorded).
func (l *Link) SetMissing(doc string, missing bool) bool {
	if l == nil {
		return false
	}
	return l.missing.set(doc, missing)
}

// MissingDetail is readiness's line on missing documents ("" for none).
func (l *Link) MissingDetail() string {
	if l == nil {
		return ""
	}
	return l.missing.detail()
}

// ReadEnforcement reads, before the first request, the enforcement switch,
// from the cache when Consul cannot give it. An edge restarted while its
// region runs in shadow must not enforce until the watch starts — nor
// while Consul is unreachable: then the cached switch applies.
func (l *Link) ReadEnforcement(ctx context.Context) {
	client := l.client
	if data, _, err := client.Get(ctx, l.region, client.Layout().Enforcement(l.region)); err == nil {
		// None in Consul: the one this edge last ran, if it kept one (a
		// Consul rebuilt empty must not change the region's switch).
		cached := false
		if !hasText(data) {
			cached, _ = l.loadEnforcementCache()
		}
		if cached {
			l.missing.set(docEnforcement, true)
			l.log.Warn("no enforcement switch in consul at start; running the cached one until one is pushed", "key", client.Layout().Enforcement(l.region), "switch", l.switchInForce())
		} else if err := l.applyEnforcement(data); err != nil {
			l.m.RulesErrors.Inc()
			l.log.Error("enforcement switch from consul refused; enforcing every key", "err", err)
		}
	} else if _, cerr := l.loadEnforcementCache(); cerr != nil {
		l.log.Warn("no enforcement switch from consul nor from the cache: enforcing every key", "err", err, "cache_err", cerr)
	}
}

// ReadRules reads, before the first request, the rules, from the cache
// when Consul cannot give them.
func (l *Link) ReadRules(ctx context.Context) {
	client := l.client
	err := region.Recover(func() error {
		docs, err := client.ReadPoPDocs(ctx, l.region, l.pop)
		if err == nil && !hasText(docs.Global) && !hasText(docs.Region) && l.loadCache() == nil {
			// No rules document in Consul, but rules on disk: the region's
			// last rules, kept as if this edge had run on.
			l.missing.set(docRules, true)
			l.log.Warn("no rules documents in consul at start; enforcing the cached rules until one is pushed", "version", l.parts.Rules.Load().Version(), "cache", l.cachePath,
				"global", client.Layout().GlobalRules(), "region", client.Layout().RegionRules(l.region))
			return nil
		}
		if err == nil {
			err = l.applyDocs(docs)
		}
		return err
	})
	if err != nil {
		l.countPanic(err)
		l.log.Warn("no valid rules from consul at start; enforcing the cached rules", "err", err, "cache", l.cachePath)
		if cerr := l.loadCache(); cerr != nil {
			l.log.Error("no cached rules either: nothing is limited and /readyz stays 503 until consul answers", "err", cerr)
		}
	}
}

// hasText says whether a document holds anything: an absent key, or one
// holding only white space, is no document.
func hasText(data []byte) bool { return len(bytes.TrimSpace(data)) > 0 }

// applyDocs merges the region's documents and swaps them in; the last good
// rules are written to the cache. A document missing where the rules in
// force had one keeps those rules (keepRules).
func (l *Link) applyDocs(docs region.Docs) error {
	if l.keepRules(docs) {
		return nil
	}
	snap, doc, err := rules.Effective(docs.Global, docs.Region, l.parts.Rules.CompileOptions()...)
	if err := l.parts.Rules.ApplySnapshot(snap, err); err != nil {
		return fmt.Errorf("rules from consul refused: %w", err)
	}
	// A canary document is not the region's: once it is deleted, an
	// absent region document is the region's rules, not a missing one.
	// What the region held before the canary stands while it runs; the
	// same for a global canary and rules/global.
	had := [2]bool{hasText(docs.Global), hasText(docs.Region)}
	if docs.GlobalCanary {
		had[0] = l.hadRules[0]
	}
	if docs.Canary {
		had[1] = l.hadRules[1]
	}
	l.hadRules = had
	if l.missing.set(docRules, false) {
		l.log.Info("rules documents are back in consul; the missing document alert clears", "version", snap.Version())
	}
	if l.cachePath == "" {
		return nil
	}
	data, err := rules.Marshal(doc) // yaml.Marshal takes tens of seconds over 100,000 rules
	if err == nil {
		err = WriteFileAtomic(l.cachePath, data)
	}
	if err != nil {
		l.log.Warn("could not cache rules", "path", l.cachePath, "err", err)
	}
	return nil
}

// keepRules says whether docs lack a rules document the edge's rules need:
// none at all, or one the rules in force came from. Then the rules in force
// stay and the document counts as missing. An edge without rules yet takes
// what there is, as before.
func (l *Link) keepRules(docs region.Docs) bool {
	snap := l.parts.Rules.Load()
	has := [2]bool{hasText(docs.Global), hasText(docs.Region)}
	gone := !has[0] && !has[1] || l.hadRules[0] && !has[0] || l.hadRules[1] && !has[1]
	if snap == nil || !gone {
		return false
	}
	if l.missing.set(docRules, true) {
		layout := l.client.Layout()
		var absent []string
		for i, key := range []string{layout.GlobalRules(), layout.RegionRules(l.region)} {
			if !has[i] {
				absent = append(absent, key)
			}
		}
		l.log.Warn("rules documents missing in consul; keeping the rules in force (an explicit document, rules: [], clears them)",
			"absent", strings.Join(absent, ","), "version", snap.Version(), "rules", len(snap.Rules()))
	}
	return true
}

func (l *Link) loadCache() error {
	if l.cachePath == "" {
		return errors.New("no rules cache")
	}
	data, err := os.ReadFile(l.cachePath)
	if err != nil {
		return err
	}
	return l.parts.Rules.Apply(data)
}

// WriteFileAtomic replaces path with data in one rename.
func WriteFileAtomic(path string, data []byte) error {
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

// RulesChanged has the edge registered again (the rules version, or
// what it reports, changed).
func (l *Link) RulesChanged() {
	if l == nil {
		return
	}
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Run watches and registers until ctx is done, and returns once every
// goroutine it started has (at once for a nil link).
func (l *Link) Run(ctx context.Context) {
	if l == nil {
		return
	}
	onErr := func(err error) {
		var refused *region.RefusedError
		switch {
		case l.countPanic(err):
		case errors.As(err, &refused):
			l.m.RulesErrors.Inc()
			l.log.Error("rules from consul refused; keeping the rules in force", "err", err, "version", l.parts.Rules.Load().Version())
		default:
			l.m.Errors.Inc()
			l.log.Warn("consul watch failed; keeping the settings in force", "err", err)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		l.client.WatchPoPRules(ctx, l.region, l.pop, func(d region.Docs) {
			if err := l.applyDocs(d); err != nil {
				l.log.Error("rules from consul refused; keeping the rules in force", "err", err, "version", l.parts.Rules.Load().Version())
			}
		}, onErr)
	})
	wg.Go(func() {
		l.client.WatchEnforcement(ctx, l.region, func(data []byte) {
			if err := l.applyEnforcement(data); err != nil {
				l.m.RulesErrors.Inc()
				l.log.Error("enforcement switch from consul refused; keeping the switch in force", "err", err)
			}
		}, onErr)
	})
	wg.Go(func() {
		l.client.WatchPoPShedder(ctx, l.region, l.pop, func(data []byte, canary bool) {
			err := l.applyShedder(data, canary)
			l.RulesChanged() // the shedder version is registered too
			if err != nil {
				l.m.RulesErrors.Inc()
				l.log.Error("shedder settings from consul refused; keeping the settings in force", "err", err)
			}
		}, onErr)
	})
	for _, watch := range l.parts.Watches {
		wg.Go(func() { watch(ctx, l.client, onErr) })
	}
	if l.rotation > 0 {
		wg.Go(func() { l.guard(ctx, "rotating session ticket keys", l.rotateTicketKeys) })
	}
	wg.Go(func() { l.guard(ctx, "counting edges", l.countEdges) })
	l.guard(ctx, "registering", l.register)
}

// countPanic logs and counts err when it is a recovered panic, and says
// whether it was.
func (l *Link) countPanic(err error) bool {
	var p *region.PanicError
	if !errors.As(err, &p) {
		return false
	}
	l.m.Panics.Inc()
	l.log.Error("panic in the consul watchers recovered; keeping the settings in force", "err", err, "stack", string(p.Stack))
	return true
}

// guard runs loop until ctx is done; a panic in it is recovered, logged,
// counted, and the loop started again after a pause.
func (l *Link) guard(ctx context.Context, what string, loop func(context.Context)) {
	for ctx.Err() == nil {
		err := region.Recover(func() error { loop(ctx); return nil })
		if !l.countPanic(err) {
			return
		}
		l.log.Warn("consul loop restarting after a panic", "loop", what)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// applyShedder applies the region's shedder document; none means the
// settings the edge started with, unless the settings in force came from
// Consul: then they stay, and the document counts as missing (`shedder set
// --reset` writes the defaults explicitly). A canary document is not the
// region's: applying it leaves shedderFromConsul as the region's document
// had it, so that once the canary is deleted an absent region document
// means the starting settings again, not a missing one.
func (l *Link) applyShedder(data []byte, canary bool) error {
	if !hasText(data) {
		if l.shedderFromConsul {
			if l.missing.set(docShedder, true) {
				l.log.Warn("shedder settings missing in consul; keeping the settings in force", "key", l.client.Layout().Shedder(l.region))
			}
			return nil
		}
		return l.parts.Shedder.Start()
	}
	cfg, err := shedder.ParseConfig(data)
	if err != nil {
		return err
	}
	if err := l.parts.Shedder.Update(cfg); err != nil {
		return err
	}
	if !canary {
		l.shedderFromConsul = true
	}
	l.missing.set(docShedder, false)
	l.log.Info("shedder settings from consul applied", "canary", canary, "good", cfg.Good, "bad", cfg.Bad, "start_after", cfg.StartAfter, "full_after", cfg.FullAfter, "enabled", cfg.Enabled)
	return nil
}

// register keeps the catalog entry current: at start, whenever the rules
// version changes, and again after a failure.
func (l *Link) register(ctx context.Context) {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.changed:
		case <-retry.C:
		}
		l.reg.RulesVersion = l.parts.Rules.Load().Version()
		l.reg.ShedderVersion = shedder.SettingsVersion(l.parts.Shedder.Config())
		if l.parts.Hosts != nil {
			l.reg.HostsVersion = l.parts.Hosts.Version()
		}
		if l.parts.Global != nil {
			l.reg.GlobalShare = l.parts.Global.Unreachable()
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.client.Register(rctx, l.reg)
		if err == nil && l.rlsReg != nil {
			err = l.client.RegisterRLS(rctx, *l.rlsReg)
		}
		cancel()
		if err != nil {
			l.m.Errors.Inc()
			l.log.Warn("registering in consul failed; retrying", "err", err)
			retry.Reset(5 * time.Second)
		}
	}
}

// Deregister takes the edge and its rate limit service out of the
// catalog (nothing for a nil link).
func (l *Link) Deregister() {
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := l.client.Deregister(ctx, l.reg.ID); err != nil {
		l.log.Warn("deregistering from consul failed", "err", err)
	}
	if l.rlsReg != nil {
		if err := l.client.Deregister(ctx, l.rlsReg.ID); err != nil {
			l.log.Warn("deregistering the rate limit service from consul failed", "err", err)
		}
	}
}

// countEdges follows the region's healthy edges (a blocking query) and sets
// the fallback's divisors: the local share of a limit when Redis is down.
func (l *Link) countEdges(ctx context.Context) {
	var index uint64
	wait := time.Second
	for ctx.Err() == nil {
		edges, next, err := l.client.Edges(ctx, l.region, index, 5*time.Minute)
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
		inRegion, inPoP := region.Count(edges, l.region, l.pop)
		l.parts.SetEdges(inRegion, inPoP)
	}
}
