package regionctl

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// certs put --region R NAME FILE
func (a *app) certsPut(args []string) error {
	fs := a.flags("certs put", "--region R NAME FILE")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("certs put takes a name and a file (chain and key, PEM), got %q", pos)
	}
	name, file := pos[0], pos[1]
	if !region.ValidCertName(name) {
		return usagef("certs put: %q: %v", name, region.ErrBadCertName)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	names, notAfter, err := certstore.Check(data)
	if err != nil {
		return invalidf("%s: not a certificate the edges would serve: %v; nothing was written", file, err)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := s.ctx()
	defer cancel()
	if err := s.c.PutCert(ctx, r, name, data); err != nil {
		return need(err, "key:write on "+s.layout.Certs(r))
	}
	key := s.layout.Certs(r) + name
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "name": name, "key": key, "names": names, "not_after": notAfter.UTC()})
		return nil
	}
	a.printf("certificate %s written to %s (%s; expires %s); the edges of %s serve it within seconds\n",
		name, key, strings.Join(names, ", "), notAfter.UTC().Format(time.RFC3339), r)
	return nil
}

// certs list --region R
func (a *app) certsList(args []string) error {
	fs := a.flags("certs list", "--region R")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("certs list takes no arguments, got %q", pos)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := s.ctx()
	defer cancel()
	certs, err := s.c.Certs(ctx, r)
	if err != nil {
		return need(err, "key:read on "+s.layout.Certs(r))
	}
	type row struct {
		Name        string    `json:"name"`
		Names       []string  `json:"names,omitempty"`
		NotAfter    time.Time `json:"not_after,omitzero"`
		ModifyIndex uint64    `json:"modify_index"`
		Invalid     string    `json:"invalid,omitempty"` // why the edges refuse it
	}
	rows := make([]row, 0, len(certs))
	for _, c := range certs {
		rw := row{Name: c.Name, ModifyIndex: c.ModifyIndex}
		if names, notAfter, err := certstore.Check(c.PEM); err != nil {
			rw.Invalid = err.Error()
		} else {
			rw.Names, rw.NotAfter = names, notAfter.UTC()
		}
		rows = append(rows, rw)
	}
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "prefix": s.layout.Certs(r), "certificates": rows})
		return nil
	}
	a.printf("# certificates of %s (%s)\n", r, s.layout.Certs(r))
	for _, rw := range rows {
		if rw.Invalid != "" {
			a.printf("%s\tINVALID (the edges refuse it): %s\tModifyIndex %d\n", rw.Name, rw.Invalid, rw.ModifyIndex)
			continue
		}
		a.printf("%s\t%s\texpires %s\tModifyIndex %d\n", rw.Name, strings.Join(rw.Names, ","), rw.NotAfter.Format(time.RFC3339), rw.ModifyIndex)
	}
	return nil
}

// certs rm --region R NAME
func (a *app) certsRm(args []string) error {
	fs := a.flags("certs rm", "--region R NAME")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("certs rm takes one name, got %q", pos)
	}
	name := pos[0]
	if !region.ValidCertName(name) {
		return usagef("certs rm: %q: %v", name, region.ErrBadCertName)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := s.ctx()
	defer cancel()
	key := s.layout.Certs(r) + name
	if err := s.c.DeleteCert(ctx, r, name); err != nil {
		if errors.Is(err, region.ErrNotFound) {
			return fmt.Errorf("no certificate %s in %s (%s)", name, r, key)
		}
		return need(err, "key:write on "+s.layout.Certs(r))
	}
	if a.json() {
		a.emitJSON(map[string]any{"region": r, "name": name, "key": key, "deleted": true})
		return nil
	}
	a.printf("certificate %s deleted from %s\n", name, key)
	return nil
}
