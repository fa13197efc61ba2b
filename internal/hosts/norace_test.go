//go:build !race

package hosts

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// scaleHosts: see race_test.go.
const scaleHosts = MaxHosts

// A table one host over the limit is refused with the count, before its
// entries are decoded. (Without -race only: it parses 100,000 hosts.)
func TestParseRefusesOneHostTooMany(t *testing.T) {
	require.Equal(t, []string{"line 8: hosts: 100001 hosts, at most 100000"}, problemsOf(t, scaleDoc(MaxHosts+1)))
}
