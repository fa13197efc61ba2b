package region

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Document schemas. Every kind of document has an integer schema; every
// field of it records the schema it was introduced in (schema 1: every
// field of release 0.1.0). A document needs the newest schema among the
// fields it uses, and an edge registers the newest schema it reads of each
// kind (catalog meta schema_<kind>), so regionctl can refuse a document some
// running edge would reject as unknown (docs/compatibility.md).
//
// A field is a path of names from the document's root: list elements add
// nothing, "*" stands for any key of a map keyed by the operator (host
// names, pool names), a name nesting itself (rate limit descriptors) adds
// nothing either, and "X.**" makes what is under X free-form.

// Schema kinds, as the catalog meta names them (schema_<kind>).
const (
	SchemaRules       = "rules" // the global and region rules documents
	SchemaShedder     = "shedder"
	SchemaHosts       = "hosts"
	SchemaEnforcement = "enforcement"
	SchemaRLS         = "rls"
)

// SchemaKind is the schema kind of a history entry's kind ("" when none).
func SchemaKind(entryKind string) string {
	switch entryKind {
	case KindGlobalRules, KindRegionRules:
		return SchemaRules
	case KindShedder:
		return SchemaShedder
	case KindHosts:
		return SchemaHosts
	case KindEnforcement:
		return SchemaEnforcement
	case KindRLS:
		return SchemaRLS
	}
	return ""
}

// Fields maps a kind's field paths to the schema each was introduced in.
type Fields map[string]int

// Schemas are the fields of every kind.
type Schemas map[string]Fields

// Reads is the newest schema of each kind: what a binary built with these
// tables reads.
func (s Schemas) Reads() map[string]int {
	out := make(map[string]int, len(s))
	for kind, f := range s {
		out[kind] = max(1, slices.Max(slices.Collect(maps.Values(f))))
	}
	return out
}

// Need is what a document requires of its readers.
type Need struct {
	Kind   string
	Schema int
	// Fields are the document's fields introduced in Schema, when it is
	// above 1: the ones an older edge cannot read.
	Fields []string
}

// Required is the schema a document of kind (a schema kind) needs: the
// newest among the fields it uses. An empty document needs schema 1. A field
// the table does not list is an error: the document is not of this kind, or
// this binary does not know the field.
func (s Schemas) Required(kind string, data []byte) (Need, error) {
	need := Need{Kind: kind, Schema: 1}
	f, ok := s[kind]
	if !ok {
		return need, fmt.Errorf("document schema: unknown kind %q", kind)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return need, fmt.Errorf("%s document schema: %w", kind, err)
	}
	if err := f.walk(doc, "", &need); err != nil {
		return need, fmt.Errorf("%s document schema: %w", kind, err)
	}
	slices.Sort(need.Fields)
	need.Fields = slices.Compact(need.Fields)
	return need, nil
}

func (f Fields) walk(v any, path string, need *Need) error {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			if err := f.walk(e, path, need); err != nil {
				return err
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if err := f.field(k, v[k], path, need); err != nil {
				return err
			}
		}
	case map[any]any: // keys that are not all strings
		for k, e := range v {
			if err := f.field(fmt.Sprint(k), e, path, need); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f Fields) field(k string, v any, path string, need *Need) error {
	p := join(path, k)
	if _, ok := f[p]; !ok {
		switch _, any := f[join(path, "*")]; {
		case any:
			p = join(path, "*")
		case path != "" && (path == k || strings.HasSuffix(path, "."+k)):
			p = path // a field nesting itself
		default:
			return fmt.Errorf("unknown field %s", strconv.Quote(p))
		}
	}
	switch sc := f[p]; {
	case sc > need.Schema:
		need.Schema, need.Fields = sc, []string{p}
	case sc == need.Schema && sc > 1:
		need.Fields = append(need.Fields, p)
	}
	if _, free := f[p+".**"]; free {
		return nil
	}
	return f.walk(v, p, need)
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// DocumentSchemas are the fields this binary reads, by kind. A new field
// gets the kind's next schema: its line in CHANGELOG.md says so, and edges
// of older releases are refused documents that use it.
var DocumentSchemas = Schemas{
	SchemaRules:       rulesFields,
	SchemaShedder:     shedderFields,
	SchemaHosts:       hostsFields,
	SchemaEnforcement: {"mode": 1, "percent": 1},
	SchemaRLS:         rlsFields,
}

// Meta keys of an edge's catalog entry for its version and schemas.
const (
	metaVersion      = "version"
	metaSchemaPrefix = "schema_"
)

// Reads is the schema of kind the edge reads: its schema_<kind> meta, and 1
// (every field of 0.1.0) for an edge that registered none (0.1.0 edges) or
// registered garbage.
func (e Edge) Reads(kind string) int {
	if n, ok := e.Schemas[kind]; ok && n >= 1 {
		return n
	}
	return 1
}

func schemaMeta(meta map[string]string) map[string]int {
	out := map[string]int{}
	for k, v := range meta {
		kind, ok := strings.CutPrefix(k, metaSchemaPrefix)
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(v); err == nil && n >= 1 {
			out[kind] = n
		}
	}
	return out
}

// The fields of 0.1.0, schema 1 each. TestEveryFieldHasASchema holds these
// tables to the document structs.

var rulesFields = Fields{
	"behaviour":                                1,
	"behaviour.burst_window":                   1,
	"behaviour.cooldown":                       1,
	"behaviour.horizon":                        1,
	"behaviour.hysteresis":                     1,
	"behaviour.identity":                       1,
	"behaviour.levels":                         1,
	"behaviour.levels.blocked":                 1,
	"behaviour.levels.blocked.block":           1,
	"behaviour.levels.blocked.limit_factor":    1,
	"behaviour.levels.blocked.lowest_tier":     1,
	"behaviour.levels.elevated":                1,
	"behaviour.levels.elevated.block":          1,
	"behaviour.levels.elevated.limit_factor":   1,
	"behaviour.levels.elevated.lowest_tier":    1,
	"behaviour.levels.suspicious":              1,
	"behaviour.levels.suspicious.block":        1,
	"behaviour.levels.suspicious.limit_factor": 1,
	"behaviour.levels.suspicious.lowest_tier":  1,
	"behaviour.mode":                           1,
	"behaviour.signals":                        1,
	"behaviour.signals.burst_free":             1,
	"behaviour.signals.burst_span":             1,
	"behaviour.signals.denial_free":            1,
	"behaviour.signals.denial_span":            1,
	"behaviour.signals.replay_free":            1,
	"behaviour.signals.replay_gap":             1,
	"behaviour.signals.replay_span":            1,
	"behaviour.signals.scan_free":              1,
	"behaviour.signals.scan_span":              1,
	"behaviour.thresholds":                     1,
	"behaviour.thresholds.blocked":             1,
	"behaviour.thresholds.elevated":            1,
	"behaviour.thresholds.suspicious":          1,
	"behaviour.weights":                        1,
	"behaviour.weights.burst":                  1,
	"behaviour.weights.denial":                 1,
	"behaviour.weights.replay":                 1,
	"behaviour.weights.scan":                   1,
	"rules":                                    1,
	"rules.accuracy":                           1,
	"rules.algorithm":                          1,
	"rules.behaviour":                          1,
	"rules.burst":                              1,
	"rules.bypass":                             1,
	"rules.bypass.api_key_header":              1,
	"rules.bypass.api_key_sha256":              1,
	"rules.bypass.cidrs":                       1,
	"rules.bypass.hosts":                       1,
	"rules.bypass.path_prefix":                 1,
	"rules.cost":                               1,
	"rules.cost_header":                        1,
	"rules.count_if":                           1,
	"rules.count_if.header":                    1,
	"rules.count_if.status":                    1,
	"rules.disabled":                           1,
	"rules.id":                                 1,
	"rules.key":                                1,
	"rules.limit":                              1,
	"rules.limit_header":                       1,
	"rules.match":                              1,
	"rules.match.hosts":                        1,
	"rules.match.methods":                      1,
	"rules.match.path_prefix":                  1,
	"rules.max_cost":                           1,
	"rules.metrics":                            1,
	"rules.min_interval":                       1,
	"rules.overrides":                          1,
	"rules.overrides.burst":                    1,
	"rules.overrides.key":                      1,
	"rules.overrides.limit":                    1,
	"rules.penalty":                            1,
	"rules.scope":                              1,
	"rules.shadow":                             1,
	"rules.tolerance":                          1,
	"rules.window":                             1,
	"version":                                  1,
}

var shedderFields = Fields{
	"adaptive":                    1,
	"adaptive.buffer":             1,
	"adaptive.enabled":            1,
	"adaptive.initial_limit":      1,
	"adaptive.max_limit":          1,
	"adaptive.min_limit":          1,
	"adaptive.min_rtt_window":     1,
	"adaptive.shares":             1,
	"adaptive.shares.critical":    1,
	"adaptive.shares.read":        1,
	"adaptive.shares.test":        1,
	"adaptive.shares.write":       1,
	"adaptive.smoothing":          1,
	"adaptive.window":             1,
	"bad":                         1,
	"critical_queue_timeout":      1,
	"enabled":                     1,
	"full_after":                  1,
	"good":                        1,
	"host_share":                  1,
	"host_share.enabled":          1,
	"host_share.tracked_hosts":    1,
	"host_share.weights":          2,
	"host_share.weights.*":        2,
	"host_share.default_weight":   2,
	"host_share.queue_timeout":    3,
	"host_share.max_queued":       3,
	"host_share.cpu_busy":         3,
	"host_share.unlisted_hosts":   3,
	"queue_size":                  1,
	"queue_timeout":               1,
	"runtime_lag_bad":             1,
	"share_window":                1,
	"smoothing":                   1,
	"start_after":                 1,
	"tiers":                       1,
	"tiers.api_key_header":        1,
	"tiers.api_keys":              1,
	"tiers.api_keys.prefix":       1,
	"tiers.api_keys.tier":         1,
	"tiers.api_keys.trusted_only": 1,
	"tiers.paths":                 1,
	"tiers.paths.prefix":          1,
	"tiers.paths.tier":            1,
	"tiers.paths.trusted_only":    1,
	"tiers.priority_header":       1,
	"tiers.read_methods":          1,
	"tiers.test_mode_header":      1,
}

var hostsFields = Fields{
	"hosts":                             1,
	"hosts.*":                           1,
	"hosts.*.pool":                      1,
	"hosts.*.path_semantics":            2,
	"hosts.*.refuse_ambiguous_paths":    2,
	"hosts.*.forward_normalized_path":   2,
	"defaults":                          2,
	"defaults.path_semantics":           2,
	"defaults.refuse_ambiguous_paths":   2,
	"defaults.forward_normalized_path":  2,
	"pools":                             1,
	"pools.*":                           1,
	"pools.*.concurrency":               2,
	"pools.*.concurrency.adaptive":      2,
	"pools.*.concurrency.initial_limit": 2,
	"pools.*.concurrency.limit":         2,
	"pools.*.concurrency.min_limit":     2,
	"pools.*.concurrency.queue":         2,
	"pools.*.concurrency.queue_timeout": 2,
	"pools.*.dial_timeout":              1,
	"pools.*.eject_for":                 1,
	"pools.*.header_timeout":            1,
	"pools.*.health_check_interval":     1,
	"pools.*.health_check_path":         1,
	"pools.*.max_conns":                 1,
	"pools.*.max_request_body_size":     1,
	"pools.*.read_idle_timeout":         1,
	"pools.*.rewrite_host":              1,
	"pools.*.timeout":                   1,
	"pools.*.tls":                       1,
	"pools.*.tls.ca_pem":                1,
	"pools.*.tls.insecure_skip_verify":  1,
	"pools.*.tls.server_name":           1,
	"pools.*.unhealthy_after":           1,
	"pools.*.urls":                      1,
	"version":                           1,
}

// rlsFields are envoyproxy/ratelimit's configuration, as pkg/rlsconfig
// reads it (descriptors nest themselves; metadata is free-form).
var rlsFields = Fields{
	"domain":                                   1,
	"descriptors":                              1,
	"descriptors.key":                          1,
	"descriptors.value":                        1,
	"descriptors.rate_limit":                   1,
	"descriptors.rate_limit.unit":              1,
	"descriptors.rate_limit.requests_per_unit": 1,
	"descriptors.rate_limit.unlimited":         1,
	"descriptors.rate_limit.name":              1,
	"descriptors.rate_limit.replaces":          1,
	"descriptors.rate_limit.replaces.name":     1,
	"descriptors.rate_limit.algorithm":         1,
	"descriptors.rate_limit.window":            1,
	"descriptors.rate_limit.burst":             1,
	"descriptors.shadow_mode":                  1,
	"descriptors.quota_mode":                   1,
	"descriptors.share_threshold":              1,
	"descriptors.detailed_metric":              1,
	"descriptors.value_to_metric":              1,
	"descriptors.metadata":                     1,
	"descriptors.metadata.**":                  1,
}
