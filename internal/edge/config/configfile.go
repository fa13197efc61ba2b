package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/pkg/suggest"
)

// The config file (--config FILE, YAML) holds any flag by its name:
//
//	listen: 127.0.0.1:8080
//	redis-timeout: 50ms
//	trusted-proxies: [10.0.0.0/8, 192.0.2.1]
//
// A flag on the command line wins over its EDGEGUARD_ variable, which
// wins over the file, which wins over the default. An unknown key is an
// error naming the nearest flag.

// applyConfigFile sets, from the file at path, every flag neither the
// command line nor the environment set.
func applyConfigFile(fs *flag.FlagSet, path string, setElsewhere map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config %s: line %d: want a mapping of flag names to values", path, root.Line)
	}
	var errs []error
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		at := fmt.Sprintf("config %s: line %d: %s", path, k.Line, name)
		if seen[name] {
			errs = append(errs, fmt.Errorf("%s: given twice", at))
			continue
		}
		seen[name] = true
		if fs.Lookup(name) == nil || name == "config" {
			errs = append(errs, fmt.Errorf("%s: unknown setting%s", at, didYouMean(name, flagNames(fs))))
			continue
		}
		val, err := scalarOrList(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
			continue
		}
		if setElsewhere[name] {
			continue
		}
		if err := fs.Set(name, val); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, setError(fs.Lookup(name), val, err)))
		}
	}
	return errors.Join(errs...)
}

// scalarOrList is a value as its flag reads it: a list comma-joined.
func scalarOrList(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value, nil
	case yaml.SequenceNode:
		vs := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return "", errors.New("a list holds plain values")
			}
			vs = append(vs, c.Value)
		}
		return strings.Join(vs, ","), nil
	}
	return "", errors.New("want a value or a list of values")
}

func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// toolingVariables are EDGEGUARD_ variables the project's scripts read,
// not the edge.
var toolingVariables = []string{"EDGEGUARD_CACHE", "EDGEGUARD_ROOT", "EDGEGUARD_PROMETHEUS", "EDGEGUARD_DRILLS", "EDGEGUARD_RESULTS", "EDGEGUARD_H2SPEC", "EDGEGUARD_PEBBLE"}

// checkEnviron refuses an EDGEGUARD_ variable that names no flag: a
// misspelled one would otherwise be ignored and its default silently used.
func checkEnviron(fs *flag.FlagSet, environ []string) error {
	known := map[string]bool{}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		known[EnvName(f.Name)] = true
		names = append(names, EnvName(f.Name))
	})
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "EDGEGUARD_") || known[name] || slices.Contains(toolingVariables, name) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: no such setting%s", name, didYouMean(name, names)))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}

// didYouMean names the candidate nearest to s, when one is near enough.
func didYouMean(s string, candidates []string) string {
	if best := suggest.Nearest(s, candidates); best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}
