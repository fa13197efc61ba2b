package rlsdiff

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// A Set is one configuration directory served to both services, with the
// settings both are started with.
type Set struct {
	Name  string
	Files []string // copied into the services' runtime directory
	Env   []string // added to both services' environment
}

// Sets finds the reference's configuration files in its checkout:
// examples/ratelimit/config and the integration runtime directory, each
// as one set; every file of test/config alone; the two documents of one
// domain merged (MERGE_DOMAIN_CONFIG); and the example set again with
// the response header fields and with QUOTA_MODE.
func Sets(src string) ([]Set, error) {
	var sets []Set
	dirs := []string{"examples/ratelimit/config", "test/integration/runtime/current/ratelimit/config"}
	for _, d := range dirs {
		fs, err := yamlFiles(filepath.Join(src, d))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		sets = append(sets, Set{Name: d, Files: fs})
	}
	if len(sets) > 0 {
		ex := sets[0]
		sets = append(sets,
			Set{Name: ex.Name + " +headers", Files: ex.Files, Env: []string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"}},
			Set{Name: ex.Name + " +quota", Files: ex.Files, Env: []string{"QUOTA_MODE=true"}},
			Set{Name: ex.Name + " +shadow", Files: ex.Files, Env: []string{"SHADOW_MODE=true"}},
		)
	}
	fs, err := filepath.Glob(filepath.Join(src, "test/config/*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(fs)
	var merge []string
	for _, f := range fs {
		rel, _ := filepath.Rel(src, f)
		sets = append(sets, Set{Name: rel, Files: []string{f}})
		if b := filepath.Base(f); b == "merge_domain_key1.yaml" || b == "merge_domain_key2.yaml" {
			merge = append(merge, f)
		}
	}
	if len(merge) == 2 {
		sets = append(sets,
			Set{Name: "test/config/merge_domain_key{1,2}.yaml", Files: merge},
			Set{Name: "test/config/merge_domain_key{1,2}.yaml +merge", Files: merge, Env: []string{"MERGE_DOMAIN_CONFIG=true"}},
		)
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("no configuration files under %s (examples/ratelimit/config, test/config): not a checkout of envoyproxy/ratelimit?", src)
	}
	return sets, nil
}
