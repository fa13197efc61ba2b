package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// regionCatalog is the region catalog of the stack (global rules' homes):
// every region's Redis as its own edges are given it — on loopback, the
// address other regions' edges reach it at too.
func regionCatalog(edges []Spec) (region.Catalog, error) {
	byRegion := map[string]*EdgeSpec{}
	var salts []string
	for _, s := range edges {
		e := s.Edge
		if prev, ok := byRegion[e.Region]; ok {
			if prev.Redis != e.Redis || prev.RedisMode != e.RedisMode {
				return region.Catalog{}, fmt.Errorf("region catalog: edges of %s use different Redis (%s %s, %s %s)", e.Region, prev.RedisMode, prev.Redis, e.RedisMode, e.Redis)
			}
			continue
		}
		byRegion[e.Region] = e
		if !slices.Contains(salts, e.KeySalt) {
			salts = append(salts, e.KeySalt)
		}
	}
	if len(salts) > 1 {
		// A client's key, and so its home, would differ between regions.
		return region.Catalog{}, fmt.Errorf("region catalog: the regions' edges use %d different key salts; global rules need one", len(salts))
	}
	var cat region.Catalog
	for _, name := range sortedKeys(byRegion) {
		e := byRegion[name]
		cat.Regions = append(cat.Regions, region.CatalogRegion{Name: name, Redis: e.Redis, RedisMode: e.RedisMode})
	}
	return cat, nil
}

// pushCatalog writes the region catalog into every region with regionctl
// catalog push (the file is kept in the state dir).
func (st State) pushCatalog(ctx context.Context, bin, consul string, edges []Spec, logw io.Writer) (region.Catalog, error) {
	cat, err := regionCatalog(edges)
	if err != nil {
		return cat, err
	}
	var data bytes.Buffer
	enc := json.NewEncoder(&data)
	enc.SetEscapeHTML(false) // the URLs' & as they are
	enc.SetIndent("", "  ")
	if err := enc.Encode(cat); err != nil {
		return cat, err
	}
	path := filepath.Join(st.Dir, "region-catalog.json")
	if err := os.WriteFile(path, data.Bytes(), 0o644); err != nil {
		return cat, fmt.Errorf("writing the region catalog: %w", err)
	}
	out, err := regionctl(ctx, filepath.Join(bin, "regionctl"), consul, "catalog", "push", path)
	if err != nil {
		return cat, fmt.Errorf("pushing the region catalog: %w\n%s", err, out)
	}
	fmt.Fprintf(logw, "stackctl: region catalog pushed:\n%s", out)
	return cat, nil
}

// waitEdgesCatalog waits until every edge has loaded the catalog: its
// metrics carry edgeguard_limiter_global_fallback_share for every other
// region (the series exist once the catalog names the region).
func waitEdgesCatalog(ctx context.Context, edges []Spec, cat region.Catalog) error {
	for _, s := range edges {
		var want []string
		for _, name := range cat.Names() {
			if name != s.Edge.Region {
				want = append(want, `edgeguard_limiter_global_fallback_share{home="`+name+`"}`)
			}
		}
		if len(want) == 0 {
			continue
		}
		err := proc.Poll(ctx, "edge "+s.Edge.Name+" to load the region catalog", func(ctx context.Context) error {
			body, err := httpGet(ctx, s.Edge.AdminURL()+"/metrics")
			if err != nil {
				return err
			}
			for _, w := range want {
				if !strings.Contains(body, w) {
					return fmt.Errorf("no %s in its metrics", w)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}
