package listen

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http/httpguts"
)

// The meter's byte tables judge every field name and value as net/http's
// framer does (httpguts, the name rune by rune): all strings of up to two
// bytes, then random ones of printable, control, upper-case and non-ASCII
// bytes and runes.
func TestH2FieldChecksAreNetHTTPs(t *testing.T) {
	wireName := func(s string) bool { // net/http's readMetaFrame
		if s == "" {
			return false
		}
		for _, r := range s {
			if !httpguts.IsTokenRune(r) || ('A' <= r && r <= 'Z') {
				return false
			}
		}
		return true
	}
	check := func(s string) {
		t.Helper()
		if h2ValidWireName(s) != wireName(s) || h2ValidFieldValue(s) != httpguts.ValidHeaderFieldValue(s) {
			t.Fatalf("%q: name %v (net/http %v), value %v (net/http %v)", s,
				h2ValidWireName(s), wireName(s), h2ValidFieldValue(s), httpguts.ValidHeaderFieldValue(s))
		}
	}
	check("")
	for i := range 256 {
		check(string([]byte{byte(i)}))
		for j := range 256 {
			check(string([]byte{byte(i), byte(j)}))
		}
	}
	rng := rand.New(rand.NewPCG(47, 2))
	pieces := []string{"a", "z", "0", "-", "!", "~", " ", "\t", "\x00", "\x1f", "\x7f", "A", "Z", "é", "\u2028", "\xff", "\xc3", ":"}
	valid := 0
	for range 20000 {
		var b []byte
		for range rng.IntN(12) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		check(string(b))
		if h2ValidWireName(string(b)) {
			valid++
		}
	}
	require.Positive(t, valid, "some random names pass, or the comparison shows little")
	require.True(t, utf8.ValidString("é") && !h2ValidWireName("é") && h2ValidFieldValue("é"))
	require.True(t, h2ValidWireName("x-request-id") && !h2ValidWireName("X-Request-Id") && h2ValidFieldValue("a\tb") && !h2ValidFieldValue("a\nb"))
}
