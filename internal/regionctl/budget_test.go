package regionctl

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/rules"
	"github.com/edgeguard/edgeguard/pkg/rules/rulestest"
)

// A document whose anchors and merge keys expand past the decoding budget
// (thousands of rules merging one list of thousands of path prefixes) is
// refused by rules validate and by rules push, which leaves Consul as it
// was; before, validate called the 122 KiB one valid after 24 s and 620 MB
// and push stored it.
func TestAliasBombRefused(t *testing.T) {
	t.Parallel()
	p := prefix(t)
	for name, doc := range map[string][]byte{"122K": rulestest.AliasBomb122K(), "477K": rulestest.AliasBomb477K()} {
		f := filepath.Join(t.TempDir(), name+".yaml")
		require.NoError(t, os.WriteFile(f, doc, 0o600))

		r := runOffline(t, "rules", "validate", f)
		require.Equal(t, ExitInvalid, r.code, r)
		require.Contains(t, r.stderr, f+": invalid (1 problem)")
		require.Regexp(t, fmt.Sprintf(`%s:\d+: rule "r\d+": the document decodes to more than \d+ values \(%d per byte of its %d, and %d\), each reuse of an anchor`,
			regexp.QuoteMeta(f), rules.DecodeValuesPerByte, len(doc), rules.DecodeValuesBase), r.stderr)

		r = run(t, "rules", "push", "--prefix", p, "--region", "eu-west", f)
		require.Equal(t, ExitInvalid, r.code, r)
		require.Contains(t, r.stderr, "each reuse of an anchor")
		require.Nil(t, kv(t, euWest, p+"rules/regions/eu-west"), "nothing pushed")
	}
}
