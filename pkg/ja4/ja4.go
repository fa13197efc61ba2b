// Package ja4 computes the JA4 fingerprint of a TLS ClientHello (FoxIO's
// JA4, the TLS client part of JA4+): what a client's TLS stack offers,
// independent of the order it lists ciphers and extensions in (browsers
// shuffle extensions since 2023), so one client library gives one value.
//
//	t13d1516h2_8daaf6152771_e5627efa2ab1
//	│││ │ │ │  │            └ sha256 of the sorted extensions (less SNI and
//	│││ │ │ │  │              ALPN), "_", the signature algorithms in order
//	│││ │ │ │  └ sha256 of the sorted cipher suites (first 12 hex digits)
//	│││ │ │ └ first and last character of the first ALPN value ("00": none)
//	│││ │ └ number of extensions (two digits, at most 99)
//	│││ └ number of cipher suites (two digits, at most 99)
//	││└ d: SNI names a domain, i: no SNI
//	│└ highest TLS version offered: 13, 12, 11, 10, s3 (00: unknown)
//	└ t: TLS over TCP
//
// GREASE values (RFC 8701) are left out everywhere. The function is pure:
// the edge calls it with what crypto/tls parsed of the ClientHello.
package ja4

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
)

// Hello is what JA4 reads from a ClientHello, as sent (GREASE included).
type Hello struct {
	Versions            []uint16 // supported_versions, else the legacy version alone
	CipherSuites        []uint16
	Extensions          []uint16 // extension types, in any order
	SignatureAlgorithms []uint16
	ALPN                []string
	SNI                 bool // a server_name extension naming a host
}

// Extension types JA4 leaves out of its hash.
const (
	extServerName = 0x0000
	extALPN       = 0x0010
)

// isGREASE reports whether v is one of RFC 8701's reserved values
// (0x0a0a, 0x1a1a, … 0xfafa).
func isGREASE(v uint16) bool { return v&0x0f0f == 0x0a0a && v>>8 == v&0xff }

// Fingerprint is h's JA4.
func Fingerprint(h Hello) string {
	b := make([]byte, 0, 36)
	b = append(b, 't')
	b = append(b, version(h.Versions)...)
	if h.SNI {
		b = append(b, 'd')
	} else {
		b = append(b, 'i')
	}
	ciphers := withoutGREASE(h.CipherSuites, nil)
	exts := withoutGREASE(h.Extensions, nil)
	b = appendCount(b, len(ciphers))
	b = appendCount(b, len(exts))
	b = append(b, alpnChars(h.ALPN)...)
	b = append(b, '_')

	slices.Sort(ciphers)
	b = appendHash(b, hexList(nil, ciphers))
	b = append(b, '_')

	exts = slices.DeleteFunc(exts, func(e uint16) bool { return e == extServerName || e == extALPN })
	slices.Sort(exts)
	var s []byte
	if len(exts) > 0 {
		s = hexList(s, exts)
		if sigs := withoutGREASE(h.SignatureAlgorithms, nil); len(sigs) > 0 {
			s = append(s, '_')
			s = hexList(s, sigs)
		}
	}
	return string(appendHash(b, s))
}

func version(vs []uint16) string {
	var hi uint16
	for _, v := range vs {
		if !isGREASE(v) && v > hi {
			hi = v
		}
	}
	switch hi {
	case 0x0304:
		return "13"
	case 0x0303:
		return "12"
	case 0x0302:
		return "11"
	case 0x0301:
		return "10"
	case 0x0300:
		return "s3"
	}
	return "00"
}

func withoutGREASE(vs, dst []uint16) []uint16 {
	for _, v := range vs {
		if !isGREASE(v) {
			dst = append(dst, v)
		}
	}
	return dst
}

func appendCount(b []byte, n int) []byte {
	n = min(n, 99)
	if n < 10 {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, int64(n), 10)
}

// alpnChars is the first ALPN value's first and last characters, or those
// of its hex form when either is not an ASCII letter or digit.
func alpnChars(alpn []string) string {
	if len(alpn) == 0 || alpn[0] == "" {
		return "00"
	}
	a := alpn[0]
	first, last := a[0], a[len(a)-1]
	if alnum(first) && alnum(last) {
		return string([]byte{first, last})
	}
	h := hex.EncodeToString([]byte(a))
	return string([]byte{h[0], h[len(h)-1]})
}

func alnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// hexList appends vs as 4-digit lower-case hex, comma-separated.
func hexList(b []byte, vs []uint16) []byte {
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, hex.EncodeToString([]byte{byte(v >> 8), byte(v)})...)
	}
	return b
}

// appendHash appends the first 12 hex digits of s's SHA-256, or twelve
// zeros when s is empty.
func appendHash(b, s []byte) []byte {
	if len(s) == 0 {
		return append(b, "000000000000"...)
	}
	sum := sha256.Sum256(s)
	return append(b, hex.EncodeToString(sum[:6])...)
}
