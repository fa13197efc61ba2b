package certstore

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func serialOf(t testing.TB, c *tls.Certificate) int64 {
	t.Helper()
	require.NotNil(t, c)
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(t, err)
	return leaf.SerialNumber.Int64()
}

func write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
}

func scan(t *testing.T, s *Store) Report {
	t.Helper()
	rep, err := s.Scan()
	require.NoError(t, err)
	return rep
}

// tls13 is what a current client says in its ClientHello.
func tls13(name string) *tls.ClientHelloInfo {
	return &tls.ClientHelloInfo{
		ServerName:        name,
		SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
		CipherSuites:      []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.PSSWithSHA256, tls.PKCS1WithSHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
		SupportedPoints:   []uint8{0},
	}
}

func TestLookupByName(t *testing.T) {
	ca := testenv.NewCA(t)
	dir := t.TempDir()
	exact := ca.Issue(t, "ecdsa", "shop.example.com")
	wild := ca.Issue(t, "ecdsa", "*.example.com")
	def := ca.Issue(t, "ecdsa", "default.invalid")
	write(t, dir, "shop.pem", exact.Bundle())
	write(t, dir, "wild.crt", wild.CertPEM)
	write(t, dir, "wild.key", wild.KeyPEM)
	write(t, dir, "notes.txt", []byte("not a certificate"))
	defFile := filepath.Join(t.TempDir(), "default.pem")
	require.NoError(t, os.WriteFile(defFile, def.Bundle(), 0o600))

	for _, withDefault := range []bool{false, true} {
		s := New(dir, map[bool]string{true: defFile}[withDefault])
		rep := scan(t, s)
		require.Empty(t, rep.Refused)
		for _, tc := range []struct {
			name string
			want int64 // 0: no certificate
		}{
			{"shop.example.com", exact.Serial},
			{"SHOP.Example.COM.", exact.Serial},
			{"api.example.com", wild.Serial},
			{"a.b.example.com", 0}, // a wildcard covers one label
			{"example.com", 0},
			{"other.test", 0},
			{"", 0}, // no SNI
		} {
			t.Run(fmt.Sprintf("%s/default=%v", tc.name, withDefault), func(t *testing.T) {
				c, err := s.Certificate(tls13(tc.name))
				require.NoError(t, err)
				switch {
				case tc.want != 0:
					require.Equal(t, tc.want, serialOf(t, c))
				case withDefault:
					require.Equal(t, def.Serial, serialOf(t, c))
				default:
					require.Nil(t, c)
				}
			})
		}
	}
}

func TestECDSAAndRSASideBySide(t *testing.T) {
	ca := testenv.NewCA(t)
	dir := t.TempDir()
	ec := ca.Issue(t, "ecdsa", "www.example.com")
	rs := ca.Issue(t, "rsa", "www.example.com")
	write(t, dir, "www-ecdsa.pem", ec.Bundle())
	write(t, dir, "www-rsa.pem", rs.Bundle())
	s := New(dir, "")
	scan(t, s)

	c, err := s.Certificate(tls13("www.example.com"))
	require.NoError(t, err)
	require.Equal(t, ec.Serial, serialOf(t, c), "ECDSA when the client can verify it")

	rsaOnly := tls13("www.example.com")
	rsaOnly.SupportedVersions = []uint16{tls.VersionTLS12}
	rsaOnly.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
	c, err = s.Certificate(rsaOnly)
	require.NoError(t, err)
	require.Equal(t, rs.Serial, serialOf(t, c), "RSA for a client with RSA suites only")

	noECDSASig := tls13("www.example.com")
	noECDSASig.SignatureSchemes = []tls.SignatureScheme{tls.PSSWithSHA256}
	c, err = s.Certificate(noECDSASig)
	require.NoError(t, err)
	require.Equal(t, rs.Serial, serialOf(t, c), "RSA for a client that cannot verify ECDSA signatures")
}

func TestScanReloadsRefusesAndRemoves(t *testing.T) {
	ca := testenv.NewCA(t)
	dir := t.TempDir()
	first := ca.Issue(t, "ecdsa", "a.example.com")
	write(t, dir, "a.pem", first.Bundle())
	s := New(dir, "")
	rep := scan(t, s)
	require.Equal(t, []string{filepath.Join(dir, "a")}, rep.Loaded)
	require.Equal(t, 1, s.Len())
	require.Equal(t, Report{}, scan(t, s), "nothing changed, nothing read")

	second := ca.Issue(t, "ecdsa", "a.example.com")
	write(t, dir, "a.pem", second.Bundle())
	rep = scan(t, s)
	require.Len(t, rep.Loaded, 1)
	require.Equal(t, 1, s.Len(), "replaced, not added")
	c, _ := s.Certificate(tls13("a.example.com"))
	require.Equal(t, second.Serial, serialOf(t, c), "the rotated certificate is served")

	other := ca.Issue(t, "ecdsa", "a.example.com")
	expired := ca.Issue(t, "ecdsa", "a.example.com") // key of another certificate
	for name, data := range map[string][]byte{
		"garbage":                    []byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"),
		"key of another certificate": append(append([]byte(nil), other.CertPEM...), expired.KeyPEM...),
		"no key":                     other.CertPEM,
	} {
		t.Run(name, func(t *testing.T) {
			write(t, dir, "a.pem", data)
			rep := scan(t, s)
			require.Len(t, rep.Refused, 1)
			require.Equal(t, filepath.Join(dir, "a"), rep.Refused[0].Source)
			require.Error(t, rep.Refused[0].Err)
			require.Empty(t, rep.Loaded)
			c, _ := s.Certificate(tls13("a.example.com"))
			require.Equal(t, second.Serial, serialOf(t, c), "the certificate in force stays")
			require.Equal(t, Report{}, scan(t, s), "a refused file is read again only once it changes")
		})
	}

	require.NoError(t, os.Remove(filepath.Join(dir, "a.pem")))
	rep = scan(t, s)
	require.Equal(t, []string{filepath.Join(dir, "a")}, rep.Removed)
	c, err := s.Certificate(tls13("a.example.com"))
	require.NoError(t, err)
	require.Nil(t, c)
	require.Equal(t, 0, s.Len())
}

// benchCerts are n distinct certificates (one name each, one shared key to
// keep the set-up short), made once per size.
var benchCerts = struct {
	sync.Mutex
	m map[int][][]byte
}{m: map[int][][]byte{}}

func certsFor(b *testing.B, n int) [][]byte {
	benchCerts.Lock()
	defer benchCerts.Unlock()
	if c, ok := benchCerts.m[n]; ok {
		return c
	}
	ca := testenv.NewCA(b)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(b, err)
	out := make([][]byte, n)
	for i := range out {
		out[i] = ca.IssueWithKey(b, key, fmt.Sprintf("host%d.example%d.com", i, i%97)).Bundle()
	}
	benchCerts.m[n] = out
	return out
}

// load fills a store from memory, through the same validation as a Scan.
func load(b *testing.B, certs [][]byte) *Store {
	s := New("", "")
	now := time.Now()
	for i, data := range certs {
		e, err := newEntry(fmt.Sprint(i), data, false, now)
		require.NoError(b, err)
		s.groups[e.source] = &group{entry: e}
		s.held++
		s.index(e)
	}
	return s
}

func BenchmarkCertLookup(b *testing.B) {
	for _, n := range []int{10, 100_000} {
		b.Run(fmt.Sprintf("certs=%d", n), func(b *testing.B) {
			s := load(b, certsFor(b, n))
			hellos := make([]*tls.ClientHelloInfo, 64)
			for i := range hellos {
				hellos[i] = tls13(fmt.Sprintf("host%d.example%d.com", i*(n/64), (i*(n/64))%97))
				_, err := s.Certificate(hellos[i]) // parsed once, as after the first handshake
				require.NoError(b, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c, err := s.Certificate(hellos[i%len(hellos)])
				if c == nil || err != nil {
					b.Fatal("no certificate", err)
				}
			}
		})
	}
}

// BenchmarkCertMemory reports the heap one certificate costs in the store,
// held as PEM (never used) and once parsed (after its first handshake).
func BenchmarkCertMemory(b *testing.B) {
	const n = 100_000
	certs := certsFor(b, n)
	var pemBytes int
	for _, c := range certs {
		pemBytes += len(c)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for b.Loop() {
		before := heap()
		s := load(b, certs)
		held := heap()
		for i := range n {
			_, err := s.Certificate(tls13(fmt.Sprintf("host%d.example%d.com", i, i%97)))
			require.NoError(b, err)
		}
		parsed := heap()
		b.ReportMetric(float64(held-before)/n, "B/cert-held")
		b.ReportMetric(float64(parsed-before)/n, "B/cert-parsed")
		b.ReportMetric(float64(pemBytes)/n, "B/cert-pem")
		runtime.KeepAlive(s)
	}
}

// BenchmarkScanUnchanged is one poll of a directory of 10,000 certificates
// none of which changed: what the edge pays every second to notice a change.
func BenchmarkScanUnchanged(b *testing.B) {
	const n = 10_000
	dir := b.TempDir()
	for i, data := range certsFor(b, n) {
		require.NoError(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("c%d.pem", i)), data, 0o600))
	}
	s := New(dir, "")
	rep, err := s.Scan()
	require.NoError(b, err)
	require.Len(b, rep.Loaded, n)
	b.ReportAllocs()
	for b.Loop() {
		rep, err := s.Scan()
		if err != nil || len(rep.Loaded) != 0 {
			b.Fatal(err, len(rep.Loaded))
		}
	}
}

func TestReplaceBesideTheDirectory(t *testing.T) {
	ca := testenv.NewCA(t)
	dir := t.TempDir()
	fromDir := ca.Issue(t, "ecdsa", "shop.example.com")
	write(t, dir, "shop.pem", fromDir.Bundle())
	s := New(dir, "")
	scan(t, s)

	api := ca.Issue(t, "ecdsa", "api.example.com")
	rep := s.Replace("consul", map[string][]byte{"api": api.Bundle()})
	require.Equal(t, []string{"consul:api"}, rep.Loaded)
	require.Equal(t, 2, s.Len())
	c, err := s.Certificate(tls13("api.example.com"))
	require.NoError(t, err)
	require.Equal(t, api.Serial, serialOf(t, c))

	// A directory scan leaves the other source's certificates alone.
	require.Empty(t, scan(t, s).Removed)
	require.Equal(t, 2, s.Len())

	// Unchanged: nothing to do.
	require.Equal(t, Report{}, s.Replace("consul", map[string][]byte{"api": api.Bundle()}))

	// Rotated: the new one is served.
	api2 := ca.Issue(t, "ecdsa", "api.example.com")
	require.Equal(t, []string{"consul:api"}, s.Replace("consul", map[string][]byte{"api": api2.Bundle()}).Loaded)
	c, err = s.Certificate(tls13("api.example.com"))
	require.NoError(t, err)
	require.Equal(t, api2.Serial, serialOf(t, c))

	// Invalid: refused, the one in force stays.
	rep = s.Replace("consul", map[string][]byte{"api": []byte("not a certificate")})
	require.Len(t, rep.Refused, 1)
	require.Equal(t, "consul:api", rep.Refused[0].Source)
	c, err = s.Certificate(tls13("api.example.com"))
	require.NoError(t, err)
	require.Equal(t, api2.Serial, serialOf(t, c))

	// Gone from the source: removed; the directory's stays.
	rep = s.Replace("consul", map[string][]byte{})
	require.Equal(t, []string{"consul:api"}, rep.Removed)
	require.Equal(t, 1, s.Len())
	c, err = s.Certificate(tls13("api.example.com"))
	require.NoError(t, err)
	require.Nil(t, c)
	c, err = s.Certificate(tls13("shop.example.com"))
	require.NoError(t, err)
	require.Equal(t, fromDir.Serial, serialOf(t, c))
}

func TestCheck(t *testing.T) {
	ca := testenv.NewCA(t)
	l := ca.Issue(t, "rsa", "a.example.com", "*.b.example.com")
	names, notAfter, err := Check(l.Bundle())
	require.NoError(t, err)
	require.Equal(t, []string{"a.example.com", "*.b.example.com"}, names)
	require.True(t, notAfter.After(time.Now()))
	_, _, err = Check(l.CertPEM)
	require.Error(t, err, "no key")
}
