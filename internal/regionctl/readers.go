package regionctl

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// Every document write — rules, shedder settings, host table, enforcement
// switch, rate limit service documents — passes readable just before it
// writes: a document that uses a field newer than some registered edge of
// the region reads (its catalog meta schema_<kind>; none, as edges of 0.1.0
// register, is schema 1) is refused, naming the edges and the fields, unless
// --force, which asks for confirmation on a terminal (--yes skips it).
// Those edges would reject the document and keep their old one: the region
// would run two documents at once.

// pushedDoc is one document a write puts in a region.
type pushedDoc struct {
	kind string // the history entry's kind (region.KindShedder, ...)
	key  string
	data []byte
}

// forceFlag registers --force on a command that writes documents; yes is
// that command's --yes.
func (a *app) forceFlag(fs *flag.FlagSet, yes *bool) {
	fs.BoolVar(&a.force, "force", false, "push a document that some registered edge of the region cannot read (it uses a field newer than the edge's schema): those edges keep their old document; asks for confirmation on a terminal")
	a.yes = yes
}

func (a *app) documentSchemas() region.Schemas {
	if a.schemas != nil {
		return a.schemas
	}
	return region.DocumentSchemas
}

// unreadable is one document some edges cannot read.
type unreadable struct {
	need  region.Need
	key   string
	edges []region.Edge
}

// maxListed bounds the edges a refusal names.
const maxListed = 20

func (u unreadable) describe(r string) string {
	names := make([]string, 0, min(len(u.edges), maxListed))
	for i, e := range u.edges {
		if i == maxListed {
			names = append(names, fmt.Sprintf("and %d more", len(u.edges)-maxListed))
			break
		}
		state := ""
		if !e.Healthy {
			state = ", unhealthy"
		}
		names = append(names, fmt.Sprintf("%s (pop %s, version %s, reads %s schema %d%s)",
			e.ID, dash(e.PoP), dash(e.Version), u.need.Kind, e.Reads(u.need.Kind), state))
	}
	return fmt.Sprintf("%s uses %s, of %s schema %d, which %s of %s cannot read: %s",
		u.key, strings.Join(u.need.Fields, ", "), u.need.Kind, u.need.Schema,
		plural(len(u.edges), "registered edge"), r, strings.Join(names, "; "))
}

// readable refuses (exit 9) to write docs to region r when some registered
// edge of r cannot read one of them, unless --force and confirmed.
func (s *session) readable(r string, docs []pushedDoc) error {
	var needs []region.Need
	var keys []string
	for _, d := range docs {
		kind := region.SchemaKind(d.kind)
		if kind == "" {
			continue
		}
		need, err := s.a.documentSchemas().Required(kind, d.data)
		if err != nil {
			return invalidf("%s: %s; nothing was written to %s", d.key, oneLine(err), r)
		}
		if need.Schema > 1 { // every edge reads schema 1
			needs, keys = append(needs, need), append(keys, d.key)
		}
	}
	if len(needs) == 0 {
		return nil
	}
	edges, err := s.edges(r)
	switch {
	case err != nil && !s.a.force:
		return err
	case err != nil:
		fmt.Fprintf(s.a.stderr, "regionctl: warning: --force: writing to %s without checking that its edges can read it: %s\n", r, s.a.message(err))
		return s.a.confirmForced(r)
	}
	var bad []unreadable
	for i, need := range needs {
		u := unreadable{need: need, key: keys[i]}
		for _, e := range edges {
			if e.Reads(need.Kind) < need.Schema {
				u.edges = append(u.edges, e)
			}
		}
		if len(u.edges) > 0 {
			slices.SortFunc(u.edges, func(a, b region.Edge) int { return strings.Compare(a.ID, b.ID) })
			bad = append(bad, u)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	lines := make([]string, len(bad))
	for i, u := range bad {
		lines[i] = u.describe(r)
	}
	show := func(w io.Writer) {
		for _, l := range lines {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if !s.a.force {
		msg := fmt.Sprintf("refusing to write to %s: %s; upgrade those edges first, or push with --force (they keep their old document); nothing was written to %s",
			r, strings.Join(lines, "; "), r)
		return &codedError{code: ExitUnreadable, msg: msg}
	}
	fmt.Fprintf(s.a.stderr, "regionctl: warning: --force: writing to %s documents some registered edges cannot read; they keep their old document:\n", r)
	show(s.a.stderr)
	return s.a.confirmForced(r)
}

// confirmForced asks on a terminal, unless --yes, before a forced write.
func (a *app) confirmForced(r string) error {
	if a.yes != nil && *a.yes {
		return nil
	}
	return a.confirm(func(io.Writer) {}, fmt.Sprintf("Write to %s anyway?", r))
}
