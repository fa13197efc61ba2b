package regionctl

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// session is a configured Consul client for one command.
type session struct {
	a       *app
	c       *region.Client
	layout  region.Layout
	close   func()
	regions []string // cached Regions()
}

// connect builds the Consul client from the global flags: the consul api's
// defaults with every flag applied on top. It does not contact Consul.
func (a *app) connect() (*session, error) {
	cfg := api.DefaultConfig()
	addr := a.g.consul
	cfg.Scheme = "http"
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		switch scheme {
		case "http", "https":
			cfg.Scheme, addr = scheme, rest
		default:
			return nil, usagef("--consul: unsupported scheme %q (want http:// or https://)", scheme)
		}
	}
	addr = strings.TrimSuffix(addr, "/")
	if addr == "" {
		return nil, usagef("--consul: empty address")
	}
	cfg.Address = addr
	cfg.Token = a.g.token
	cfg.TokenFile = ""
	cfg.TLSConfig.CAFile = a.g.caFile
	cfg.TLSConfig.CertFile = a.g.certFile
	cfg.TLSConfig.KeyFile = a.g.keyFile
	if (a.g.certFile == "") != (a.g.keyFile == "") {
		return nil, usagef("--cert-file and --key-file go together")
	}
	for _, f := range []string{a.g.caFile, a.g.certFile, a.g.keyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("TLS file: %w", err)
		}
	}
	// Our own HTTP client, so that even calls without a context (listing
	// datacenters) are bounded by --timeout.
	hc, err := api.NewHttpClient(cfg.Transport, cfg.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("configuring TLS: %w", err)
	}
	hc.Timeout = a.g.timeout
	cfg.HttpClient = hc
	c, err := region.NewClient(cfg, a.g.prefix)
	if err != nil {
		return nil, err
	}
	if a.onPart != nil {
		c.OnPart(a.onPart)
	}
	transport := cfg.Transport
	return &session{a: a, c: c, layout: c.Layout(), close: func() { closeIdle(transport) }}, nil
}

func closeIdle(t *http.Transport) {
	if t != nil {
		t.CloseIdleConnections()
	}
}

// ctx bounds one request by --timeout.
func (s *session) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.a.g.timeout)
}

// allRegions lists the Consul datacenters, sorted.
func (s *session) allRegions() ([]string, error) {
	if s.regions != nil {
		return s.regions, nil
	}
	rs, err := s.c.Regions()
	if err != nil {
		return nil, err
	}
	slices.Sort(rs)
	s.regions = rs
	return rs, nil
}

// connectRegion connects and checks that r is a known region.
func (a *app) connectRegion(r string) (*session, error) {
	s, err := a.connect()
	if err != nil {
		return nil, err
	}
	if err := s.checkRegion(r); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// checkRegion refuses a region that is not a Consul datacenter, naming the
// known ones.
func (s *session) checkRegion(r string) error {
	if r == "" {
		return usagef("--region is required")
	}
	rs, err := s.allRegions()
	if err != nil {
		return err
	}
	if !slices.Contains(rs, r) {
		return &codedError{code: ExitUnknown, err: region.ErrUnknownRegion,
			msg: fmt.Sprintf("unknown region %q: no Consul datacenter of that name (known: %s)", r, strings.Join(rs, ", "))}
	}
	return nil
}

// readDocs reads a region's rule documents.
func (s *session) readDocs(r string) (region.Docs, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	d, err := s.c.ReadDocs(ctx, r)
	if err != nil {
		return d, need(err, fmt.Sprintf("key read on %s in %s", s.layout.Rules(), r))
	}
	// Consul filters a listing by the token's ACLs without an error, so a
	// document that looks absent may be one the token may not read: a
	// single-key read tells them apart (it answers 403).
	for _, key := range []struct {
		name  string
		index uint64
	}{{s.layout.GlobalRules(), d.GlobalIndex}, {s.layout.RegionRules(r), d.RegionIndex}} {
		if key.index == 0 {
			if _, _, err := s.c.Get(ctx, r, key.name); err != nil {
				return d, need(err, fmt.Sprintf("key read on %s in %s", key.name, r))
			}
		}
	}
	return d, nil
}

// get reads one key in a region.
func (s *session) get(r, key string) ([]byte, uint64, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	v, idx, err := s.c.Get(ctx, r, key)
	return v, idx, need(err, fmt.Sprintf("key read on %s in %s", key, r))
}

// history reads a region's history, newest first.
func (s *session) history(r, kind string) ([]region.Entry, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	what := fmt.Sprintf("key read on %s in %s", s.layout.History(r), r)
	h, err := s.c.History(ctx, r, kind)
	if err == nil && len(h) == 0 {
		// Filtered by ACLs, or really empty? (See readDocs.)
		_, _, err = s.c.Get(ctx, r, s.layout.History(r)+"0")
	}
	return h, need(err, what)
}

// edges lists a region's registered edges.
func (s *session) edges(r string) ([]region.Edge, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	what := fmt.Sprintf("service read on %s and node read in %s", region.Service, r)
	e, _, err := s.c.Edges(ctx, r, 0, 0)
	if err == nil && len(e) == 0 {
		// Consul filters the catalog by the token's ACLs without an
		// error; its response says when it did.
		_, meta, err := s.c.API().Health().Service(region.Service, "", false,
			(&api.QueryOptions{Datacenter: r}).WithContext(ctx))
		if err == nil && meta.ResultsFilteredByACLs {
			err = fmt.Errorf("listing edges of %s: %w (results filtered)", r, region.ErrPermissionDenied)
		}
		if err != nil && errors.Is(err, region.ErrPermissionDenied) {
			return nil, need(err, what)
		}
	}
	return e, need(err, what)
}

// push writes doc to key with check-and-set on casIndex, recording entry.
func (s *session) push(r, key string, doc []byte, casIndex uint64, e region.Entry) (region.Entry, error) {
	if s.a.beforeWrite != nil {
		s.a.beforeWrite(r)
	}
	if err := s.readable(r, []pushedDoc{{kind: e.Kind, key: key, data: doc}}); err != nil {
		return e, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	out, err := s.c.Push(ctx, r, key, doc, casIndex, e)
	return out, need(err, fmt.Sprintf("key write on %s and %s in %s", key, s.layout.History(r), r))
}

// pushRLS writes rate limit service documents to r in one transaction.
func (s *session) pushRLS(r string, writes []region.RLSWrite) ([]region.Entry, error) {
	var docs []pushedDoc
	for _, w := range writes {
		if !w.Delete {
			docs = append(docs, pushedDoc{kind: region.KindRLS, key: s.layout.RLSDoc(r, w.Name), data: w.Doc})
		}
	}
	if err := s.readable(r, docs); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	entries, err := s.c.PushRLS(ctx, r, writes)
	return entries, need(err, fmt.Sprintf("key write on %s and %s in %s", s.layout.RLS(r), s.layout.History(r), r))
}

// resolve reads the document a stored value or history entry names (itself,
// or the parts of a manifest).
func (s *session) resolve(r string, value []byte) ([]byte, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	data, err := s.c.Resolve(ctx, r, value)
	return data, need(err, fmt.Sprintf("key read on %s in %s", s.layout.Parts(), r))
}

// collectParts deletes r's stored parts that no manifest names (left by
// interrupted pushes); a failure is a warning, not a failed push.
func (s *session) collectParts(r string) (int, string) {
	ctx, cancel := s.ctx()
	defer cancel()
	n, err := s.c.CollectParts(ctx, r)
	if err != nil {
		return n, "collecting unreferenced parts: " + s.a.message(err)
	}
	return n, ""
}

// pruneHistory applies the history retention to r (keep < 1: none).
func (s *session) pruneHistory(r string, keep int) ([]region.Entry, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	pruned, err := s.c.PruneHistory(ctx, r, keep)
	return pruned, need(err, fmt.Sprintf("key read and write on %s in %s", s.layout.History(r), r))
}

// unnamedParts counts r's stored parts that no manifest names; a failure is
// a warning.
func (s *session) unnamedParts(r string) (int, string) {
	ctx, cancel := s.ctx()
	defer cancel()
	keys, err := s.c.UnnamedParts(ctx, r)
	if err != nil {
		return 0, "listing unreferenced parts: " + s.a.message(err)
	}
	return len(keys), ""
}

// historyPruning reads what history retention did in r.
func (s *session) historyPruning(r string) (region.Pruning, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	p, err := s.c.HistoryPruning(ctx, r)
	return p, need(err, fmt.Sprintf("key read on %s in %s", s.layout.HistoryPruned(r), r))
}
