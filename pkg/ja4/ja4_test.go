package ja4

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// chrome is the ClientHello of JA4's own worked example (a Chrome
// browser), with GREASE values and a shuffled extension order added: they
// must not change the fingerprint.
var chrome = Hello{
	Versions:     []uint16{0x3a3a, 0x0304, 0x0303},
	CipherSuites: []uint16{0x4a4a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035},
	Extensions: []uint16{0x0a0a, 0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023, 0x0012, 0x002b,
		0xff01, 0x000b, 0x000a, 0x0015, 0x1a1a},
	SignatureAlgorithms: []uint16{0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601},
	ALPN:                []string{"h2", "http/1.1"},
	SNI:                 true,
}

func TestFingerprint(t *testing.T) {
	require.Equal(t, "t13d1516h2_8daaf6152771_e5627efa2ab1", Fingerprint(chrome))

	for name, tc := range map[string]struct {
		mutate func(h *Hello)
		want   string
	}{
		"no SNI, no ALPN, TLS 1.2": {func(h *Hello) {
			h.SNI, h.ALPN, h.Versions = false, nil, []uint16{0x0303}
		}, "t12i151600_8daaf6152771_e5627efa2ab1"},
		"ALPN not alphanumeric": {func(h *Hello) { h.ALPN = []string{"\xab\xcd"} }, "t13d1516ad_8daaf6152771_e5627efa2ab1"},
		"one-character ALPN":    {func(h *Hello) { h.ALPN = []string{"h"} }, "t13d1516hh_8daaf6152771_e5627efa2ab1"},
		"no cipher suites, no extensions": {func(h *Hello) {
			h.CipherSuites, h.Extensions = nil, nil
		}, "t13d0000h2_000000000000_000000000000"},
	} {
		t.Run(name, func(t *testing.T) {
			h := chrome
			tc.mutate(&h)
			require.Equal(t, tc.want, Fingerprint(h))
		})
	}
	require.True(t, isGREASE(0xfafa))
	require.False(t, isGREASE(0x0a1a))
}

func BenchmarkFingerprint(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Fingerprint(chrome)
	}
}
