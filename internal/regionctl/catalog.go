package regionctl

import (
	"fmt"
	"os"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// catalog push FILE: the region catalog (global rules' homes and
// each region's Redis) into every region it lists. Consul KV is not
// replicated, so each region keeps its own copy; an edge reads its own.
func (a *app) catalogPush(args []string) error {
	fs := a.flags("catalog push", "FILE")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("catalog push takes one FILE, got %q", pos)
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	cat, err := region.ParseCatalog(data)
	if err != nil {
		return invalidf("%s: %v", pos[0], err)
	}
	s, err := a.connect()
	if err != nil {
		return err
	}
	defer s.close()
	for _, r := range cat.Names() {
		if err := s.checkRegion(r); err != nil {
			return err
		}
	}
	for _, r := range cat.Names() {
		ctx, cancel := s.ctx()
		err := s.c.PutCatalog(ctx, r, cat)
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s: region catalog written (%d regions)\n", r, len(cat.Regions))
	}
	return nil
}
