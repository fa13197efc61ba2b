package hosts

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/internal/origin"
	"github.com/edgeguard/edgeguard/pkg/pathsem"
)

// Validate reports every problem of the table at once (errors.Join of
// *Problem, without lines: those only Parse knows).
func (t *Table) Validate() error {
	errs := t.validate(lines{})
	sortProblems(errs)
	return errors.Join(errs...)
}

var poolName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// originFields maps origin.Config's field names, as its Validate reports
// them, to the pool's.
var originFields = map[string]string{"max_conns_per_host": "max_conns"}

func (t *Table) validate(l lines) []error {
	var errs []error
	bad := func(line int, path, format string, args ...any) {
		errs = append(errs, &Problem{Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	switch t.Schema {
	case SchemaVersion:
	case 0:
		bad(l.of(false), "version", "required: %d", SchemaVersion)
	default:
		bad(l.of(false, "version"), "version", "unsupported version %d (this edge reads %d)", t.Schema, SchemaVersion)
	}
	if len(t.Pools) > MaxPools {
		bad(l.of(true, "pools"), "pools", "%d pools, at most %d", len(t.Pools), MaxPools)
	}
	if len(t.Hosts) > MaxHosts {
		bad(l.of(true, "hosts"), "hosts", "%d hosts, at most %d", len(t.Hosts), MaxHosts)
	}
	for _, name := range t.PoolNames() {
		p := t.Pools[name]
		path := "pools." + quote(name)
		switch {
		case name == DefaultPool:
			bad(l.of(true, "pools", name), path, "%q is the edge's own pool (its --origin flags): hosts may use it, the table cannot define it", DefaultPool)
			continue
		case len(name) > MaxPoolNameLen || !poolName.MatchString(name):
			bad(l.of(true, "pools", name), path, "a pool name is 1-%d characters: lower-case letters, digits, '-' and '_', starting with a letter or digit", MaxPoolNameLen)
		}
		if len(p.URLs) > MaxURLsPerPool {
			bad(l.of(true, "pools", name, "urls"), path+".urls", "%d origins, at most %d", len(p.URLs), MaxURLsPerPool)
		}
		// The origin package's own checks, so a pool is refused exactly
		// when the same settings on --origin would be.
		for _, err := range unjoin(p.Origin(origin.Config{}).Validate()) {
			msg := strings.TrimPrefix(err.Error(), origin.ErrInvalidConfig.Error()+": ")
			field, rest, _ := strings.Cut(msg, ": ")
			if f, ok := originFields[field]; ok {
				field = f
			}
			steps := []string{"pools", name}
			for s := range strings.SplitSeq(field, ".") {
				if i := strings.IndexByte(s, '['); i > 0 {
					steps = append(steps, s[:i], s[i:])
				} else {
					steps = append(steps, s)
				}
			}
			bad(l.of(false, steps...), path+"."+field, "%s", rest)
		}
		if p.TLS != nil {
			if p.TLS.InsecureSkipVerify && p.TLS.CAPEM != "" {
				bad(l.of(false, "pools", name, "tls", "insecure_skip_verify"), path+".tls.insecure_skip_verify", "contradicts ca_pem: with verification off the CAs are never used")
			}
			if !slices.ContainsFunc(p.URLs, func(u string) bool { return strings.HasPrefix(strings.ToLower(u), "https://") }) && len(p.URLs) > 0 {
				bad(l.of(true, "pools", name, "tls"), path+".tls", "the pool has no https origin: its TLS settings would never be used")
			}
		}
	}
	if t.Defaults != nil {
		errs = append(errs, t.Defaults.validate(l, "defaults", "defaults")...)
	}
	seen := map[string]string{} // normalised pattern -> raw
	raws := make([]string, 0, len(t.Hosts))
	for raw := range t.Hosts {
		raws = append(raws, raw)
	}
	slices.Sort(raws)
	for _, raw := range raws {
		h := t.Hosts[raw]
		path := "hosts." + quote(raw)
		if p, err := normalizePattern(raw); err != nil {
			bad(l.of(true, "hosts", raw), path, "%v", err)
		} else if first, dup := seen[p]; dup {
			line := l.of(true, "hosts", first)
			where := ""
			if line > 0 {
				where = " (line " + strconv.Itoa(line) + ")"
			}
			bad(l.of(true, "hosts", raw), path, "the same host as %q%s: both are %q", first, where, p)
		} else {
			seen[p] = raw
		}
		errs = append(errs, h.validate(l, path, "hosts", raw)...)
		switch _, defined := t.Pools[h.Pool]; {
		case h.Pool == "":
			bad(l.of(true, "hosts", raw), path+".pool", "required: one of the table's pools or %q", DefaultPool)
		case h.Pool == DefaultPool:
		case !defined:
			bad(l.of(false, "hosts", raw, "pool"), path+".pool", "unknown pool %q (pools: %s)", h.Pool, strings.Join(poolChoices(t), ", "))
		}
	}
	return errs
}

// validate checks the path settings at path (steps: where they are in the
// document).
func (p Paths) validate(l lines, path string, steps ...string) []error {
	if p.PathSemantics == "" {
		return nil
	}
	if _, err := pathsem.Parse(p.PathSemantics); err != nil {
		at := append(slices.Clone(steps), "path_semantics")
		return []error{&Problem{Line: l.of(false, at...), Path: path + ".path_semantics", Msg: err.Error()}}
	}
	return nil
}

// quote writes a map key in a path, quoted when it is not a plain name.
func quote(s string) string {
	if s != "" && strings.Trim(strings.ToLower(s), "abcdefghijklmnopqrstuvwxyz0123456789-_") == "" {
		return s
	}
	return strconv.Quote(s)
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// poolChoices are the pools a host may name.
func poolChoices(t *Table) []string {
	out := []string{DefaultPool}
	for _, name := range t.PoolNames() {
		if name != DefaultPool {
			out = append(out, name)
		}
	}
	return out
}
