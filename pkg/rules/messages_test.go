package rules

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateMessages = flag.Bool("update-messages", false, "rewrite testdata/messages.golden")

const sha = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"

// messageRules are invalid rules, one or more per validation message: the
// text Parse reports for each is pinned in testdata/messages.golden, so a
// message whose field names come from the field table stays as operators
// (and scripts reading "regionctl rules validate") know it.
var messageRules = []string{
	`{key: [ip], algorithm: fixed_window, limit: 1, window: 1s}`,
	`{id: "a b", key: [ip], algorithm: fixed_window, limit: 1, window: 1s}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s}
  - {id: a, key: [ip], algorithm: fixed_window, limit: 2, window: 1s}`,
	`{id: a, key: [ip], limit: 1, window: 1s}`,
	`{id: a, key: [ip], algorithm: nope, limit: 1, window: 1s}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 0, window: 0s, burst: 3, min_interval: 1s, cost: 0}`,
	`{id: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, burst: 20, cost: 30}`,
	`{id: a, key: [ip], algorithm: sliding_log, limit: 10, window: 1s, min_interval: 2s}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, scope: planet}`,
	`{id: a, key: [ip], algorithm: sliding_window, limit: 1, window: 1s, scope: global, accuracy: exact}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 10, window: 1s, scope: global, count_if: {status: ["401"]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, accuracy: roughly}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, tolerance: 0.1}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, accuracy: leased, tolerance: 0.9}`,
	`{id: a, key: [ip], algorithm: sliding_log, limit: 1, window: 1s, accuracy: leased}`,
	`{id: a, algorithm: fixed_window, limit: 1, window: 1s}`,
	`{id: a, key: [ip, "bogus:x", "header:X", "header:x"], algorithm: fixed_window, limit: 1, window: 1s}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, match: {hosts: ["a b", A.com, a.com], path_prefix: [x, "/a?b", "/%2541"], methods: ["G T", get, GET]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, match: {methods: [A, B, C, D, E, F, G, H, I, a]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, limit_header: "X Y"}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, penalty: 500ms}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, penalty: 1500ms}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, penalty: 5s, shadow: true}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, bypass: {cidrs: [nope, "1.2.3.4/33"], hosts: ["a b"], path_prefix: [x], api_key_sha256: [abc]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, bypass: {api_key_header: "X Y", api_key_sha256: [` + sha + `]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, bypass: {api_key_header: X-Key}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, bypass: {api_key_sha256: [` + sha + `]}}`,
	`{id: a, key: [ip, "header:X-User"], algorithm: token_bucket, limit: 10, window: 1s, overrides: [{key: [1.2.3.4], limit: 5}, {key: [nope, bob], limit: 5}, {key: ["1.2.3.4", ""], limit: 0, burst: -1}, {key: ["::ffff:1.2.3.4", bob], limit: 5}, {key: ["1.2.3.4", bob], limit: 6}]}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, max_cost: 5}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 10, window: 1s, count_if: {status: ["600", "4xy"], header: "X Y"}, cost_header: "A B", max_cost: -1}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 10, window: 1s, count_if: {header: X-F}, max_cost: 5}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 10, window: 1s, cost_header: X-Cost, max_cost: 50}`,
	`{id: a, key: [ip], algorithm: concurrency, limit: 10, window: 1m, count_if: {status: [5xx]}}`,
	`{id: a, key: [ip], algorithm: fixed_window, limit: 10, window: 1s, disabled: true}
  - {id: "b c", disabled: true}`,
}

// TestValidationMessagesPinned holds every validation message to its
// pinned text, as Parse reports it (line, rule, field, message) and as
// Validate does for a document built in Go.
func TestValidationMessagesPinned(t *testing.T) {
	var b strings.Builder
	for _, r := range messageRules {
		src := "version: 1\nrules:\n  - " + r + "\n"
		_, err := Parse([]byte(src))
		require.Error(t, err, src)
		b.WriteString("== " + r + "\n" + err.Error() + "\n")
	}
	b.WriteString("== version 2, built in Go\n" + (&Document{Version: 2}).Validate().Error() + "\n")
	path := filepath.Join("testdata", "messages.golden")
	if *updateMessages {
		require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String())
}
