package behavior

import (
	"crypto/sha256"
	"encoding/base64"
)

// Identity kinds: the API key a rule counts by, the client address, or its
// TLS stack's JA4 fingerprint.
const (
	KindAPIKey byte = 'k'
	KindIP     byte = 'i'
	KindJA4    byte = 'j'
)

// Identity names a client in Redis, logs and /debug/clients: 22 base64url
// characters (128 bits of SHA-256) over the region's key salt, the kind and
// the value, so neither an API key nor an address can be read back (an
// unsalted hash of an IPv4 address could be enumerated). For KindIP, value
// is the client key rules.ClientKey gives (an IPv6 client's /64).
func Identity(salt []byte, kind byte, value string) string {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte{0, 'b', 'h', kind, 0})
	h.Write([]byte(value))
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:16])
}

// Hasher hashes routes and request fingerprints: FNV-1a (hash/fnv's
// function, written out so a request's hashes allocate nothing), seeded
// with the key salt. Every edge of a region has the same salt, so the
// region's sketches agree on what one route is.
type Hasher struct{ seed uint64 }

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// NewHasher seeds a Hasher with salt.
func NewHasher(salt []byte) Hasher {
	h := uint64(fnvOffset)
	for _, c := range salt {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return Hasher{seed: h}
}

func (x Hasher) add(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return (h ^ 0xff) * fnvPrime // a separator no text byte equals
}

func (x Hasher) addBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return (h ^ 0xff) * fnvPrime
}

// nonZero keeps 0 free to mean "none".
func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// Route hashes a normalized path: one route of the scan signal.
func (x Hasher) Route(path string) uint64 { return nonZero(x.add(x.seed, path)) }

// Fingerprint hashes what makes two requests the same for the replay
// signal: method, normalized path, raw query and, when given, the body
// (only a small body the edge has already read: bodies are streamed).
func (x Hasher) Fingerprint(method, path, query string, body []byte) uint64 {
	h := x.add(x.seed, method)
	h = x.add(h, path)
	h = x.add(h, query)
	if body != nil {
		h = x.addBytes(h, body)
	}
	return nonZero(h)
}

// MaxBodyFingerprint is the largest body that goes into a fingerprint.
const MaxBodyFingerprint = 4 << 10
