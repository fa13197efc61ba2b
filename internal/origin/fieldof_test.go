package origin

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// fieldOfByName is fieldOf as a comparison with every name, one by one.
func fieldOfByName(k []byte) fieldSet {
	for _, f := range []struct {
		name  string
		field fieldSet
	}{
		{fasthttp.HeaderExpect, fieldExpect},
		{fasthttp.HeaderXForwardedFor, fieldXFF},
		{fasthttp.HeaderXForwardedProto, fieldXFProto},
		{fasthttp.HeaderXForwardedHost, fieldXFHost},
		{headerForwarded, fieldForwarded},
	} {
		if len(k) == len(f.name) && bytes.EqualFold(k, []byte(f.name)) {
			return f.field
		}
	}
	for _, name := range hopByHop {
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
			return fieldHopByHop
		}
	}
	return 0
}

// fieldOf and isHopByHop pick the one name to compare by the field's
// first byte and length: they must agree with a comparison with every
// name, over the names in any case, each one byte off (in every
// position, to each neighbouring byte and to the byte that only a
// careless case fold would take for it), one byte short or long, and
// the fields requests and responses commonly carry.
func TestFieldOfAgreesWithTheNames(t *testing.T) {
	names := []string{
		fasthttp.HeaderExpect, fasthttp.HeaderXForwardedFor, fasthttp.HeaderXForwardedProto,
		fasthttp.HeaderXForwardedHost, headerForwarded,
	}
	names = append(names, hopByHop[:]...)
	var corpus []string
	for _, n := range names {
		corpus = append(corpus, n, strings.ToLower(n), strings.ToUpper(n), n[:len(n)-1], n+"s", "x"+n)
		for i := range len(n) {
			for _, c := range []byte{n[i] - 1, n[i] + 1, n[i] ^ 0x20, n[i] &^ 0x20} {
				corpus = append(corpus, n[:i]+string([]byte{c})+n[i+1:])
			}
		}
	}
	corpus = append(corpus, "", "T", "Host", "Accept", "User-Agent", "Content-Type", "Content-Length",
		"Date", "Server", "Cookie", "Set-Cookie", "Accept-Encoding", "X-Request-ID", "X-Real-IP",
		"Cache-Control", "Proxy-Authorizatio\r", "Keep\rAlive", "Trailer\x00", "\xe2\x84\xaaeep-Alive")
	hits := 0
	for _, k := range corpus {
		want := fieldOfByName([]byte(k))
		require.Equal(t, want, fieldOf([]byte(k)), "fieldOf(%q)", k)
		require.Equal(t, want == fieldHopByHop, isHopByHop([]byte(k)), "isHopByHop(%q)", k)
		if want != 0 {
			hits++
		}
	}
	// Each name in its three cases at least: the corpus reaches every branch.
	require.GreaterOrEqual(t, hits, 3*len(names))
}
