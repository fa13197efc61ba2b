package region_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/hosts"
	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// fieldPaths lists the field paths of a document type as its tag (yaml or
// json) names them: the paths DocumentSchemas must hold.
func fieldPaths(t reflect.Type, tag, path string, out *[]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Map:
		p := join(path, "*")
		*out = append(*out, p)
		fieldPaths(t.Elem(), tag, p, out)
	case reflect.Struct:
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get(tag), ",")
			if !sf.IsExported() || name == "-" || name == "" {
				continue
			}
			p := join(path, name)
			*out = append(*out, p)
			fieldPaths(sf.Type, tag, p, out)
		}
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// TestEveryFieldHasASchema: a field added to a document struct without its
// line in DocumentSchemas fails here, so a new field cannot be forgotten
// (and pushed to edges that do not read it).
func TestEveryFieldHasASchema(t *testing.T) {
	docs := []struct {
		kind string
		typ  any
		tag  string
	}{
		{region.SchemaRules, rules.Document{}, "yaml"},
		{region.SchemaShedder, shedder.Config{}, "json"},
		{region.SchemaHosts, hosts.Table{}, "yaml"},
		{region.SchemaEnforcement, region.Enforcement{}, "json"},
	}
	for _, d := range docs {
		t.Run(d.kind, func(t *testing.T) {
			var paths []string
			fieldPaths(reflect.TypeOf(d.typ), d.tag, "", &paths)
			require.NotEmpty(t, paths)
			var missing []string
			for _, p := range paths {
				if _, ok := region.DocumentSchemas[d.kind][p]; !ok {
					missing = append(missing, p)
				}
			}
			slices.Sort(missing)
			require.Empty(t, missing, "fields of %s documents without a schema in region.DocumentSchemas", d.kind)
		})
	}
}
