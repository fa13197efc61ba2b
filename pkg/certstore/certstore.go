// Package certstore holds the TLS certificates an edge serves, chosen by
// SNI, read from a directory of PEM files and re-read when they change.
//
// A certificate is a group of files with one base name in the directory:
// NAME.pem holding the chain and the key, or NAME.crt (or NAME.pem) with
// the chain and NAME.key with the key. Its names are the leaf's DNS SANs; a
// wildcard *.example.com answers for one label under example.com. Lookup
// is two map reads (the exact name, then the wildcard of its parent
// domain), whatever the number of certificates.
//
// Other sources (Consul KV) hand the store their certificates whole with
// Replace; they sit beside the directory's, under the same rules.
//
// Certificates are validated when read, so that a certificate no client
// could use is refused and the one in force keeps serving (Validate): the
// key matches the leaf, the leaf has not expired, and the chain is one a
// client takes: at most MaxChainCerts certificates of at most
// MaxChainBytes together, each signed by the next. They are kept as the
// PEM bytes read: the parsed form is built on the
// first handshake that needs it. So a store of 100,000 certificates costs
// about their PEM size, not their parsed size.
package certstore

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxFileBytes bounds one certificate file: a chain and a key are a few KiB.
const maxFileBytes = 1 << 20

// The chain a client takes. Public chains are 2 to 4 certificates (leaf,
// one or two intermediates, now and then a cross-signed root), of 1 to
// 2 KiB each; a handful of KiB in all. Clients bound the Certificate
// message that carries them: Go's crypto/tls at 256 KiB
// (maxHandshakeCertificateMsg), OpenSSL at 100 KiB by default
// (SSL_CTX_set_max_cert_list); past it, the handshake fails (OpenSSL:
// "excessive message size"). 5 certificates leave room for an unusual chain and 64
// KiB of DER for the message's own framing and the OCSP staple and SCTs
// it may carry.
const (
	MaxChainCerts = 5
	MaxChainBytes = 64 << 10
)

// ErrChain marks a chain no client could use: too long, too large, or out
// of order (a certificate not signed by the next).
var ErrChain = errors.New("unusable certificate chain")

// Store is safe for concurrent use: lookups run on every handshake while
// Scan replaces what changed.
type Store struct {
	dir, defaultFile string

	// wmu orders the writers (Scan, Replace): holding it, a writer reads
	// the groups without mu.
	wmu sync.Mutex

	mu     sync.RWMutex
	exact  map[string][]*entry // lower-case DNS name → certificates, preferred first
	wild   map[string][]*entry // "example.com" → the certificates of *.example.com
	def    *entry
	groups map[string]*group // base path → what was read from it
	held   int               // groups with a certificate
}

// entry is one certificate: its PEM bytes and, once used, its parsed form.
type entry struct {
	source    string
	pem       []byte
	names     []string
	rank      uint8 // ECDSA before RSA: smaller, and cheaper to sign with
	notBefore int64
	parsed    atomic.Pointer[tls.Certificate]
}

// group is the files of one base name as last seen, and the certificate
// they hold (nil when refused and nothing was loaded before).
type group struct {
	stamp    string
	entry    *entry
	external bool // from Replace, not the directory
}

// New is a store over dir (may be empty) and an optional default
// certificate file (chain and key) for unknown names and clients without
// SNI. Nothing is read until Scan.
func New(dir, defaultFile string) *Store {
	return &Store{
		dir: dir, defaultFile: defaultFile,
		exact: map[string][]*entry{}, wild: map[string][]*entry{}, groups: map[string]*group{},
	}
}

// Refusal is a certificate source left out, and why.
type Refusal struct {
	Source string
	Err    error
}

// Report says what one Scan changed.
type Report struct {
	Loaded, Removed []string
	Refused         []Refusal
}

// Len is the number of certificates held (the default included).
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.held
}

// Scan reads the sources whose files changed (size or modification time)
// since the last Scan. A source that fails to validate is refused and the
// certificate it would replace stays in service; a source whose files are
// gone is removed. An error is returned only when the directory cannot be
// listed (everything held stays).
func (s *Store) Scan() (Report, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	stamps := map[string][]string{} // base path → its files
	if s.dir != "" {
		des, err := os.ReadDir(s.dir)
		if err != nil {
			return Report{}, fmt.Errorf("reading certificate directory: %w", err)
		}
		for _, de := range des {
			name := de.Name()
			ext := strings.ToLower(filepath.Ext(name))
			if strings.HasPrefix(name, ".") || (ext != ".pem" && ext != ".crt" && ext != ".key") {
				continue
			}
			base := filepath.Join(s.dir, strings.TrimSuffix(name, filepath.Ext(name)))
			stamps[base] = append(stamps[base], filepath.Join(s.dir, name))
		}
	}
	if s.defaultFile != "" {
		stamps[defaultKey] = []string{s.defaultFile}
	}
	var rep Report
	seen := make(map[string]bool, len(stamps))
	var buf []byte
	for base, files := range stamps {
		seen[base] = true
		var err error
		buf, err = appendStamp(buf[:0], files)
		if err != nil {
			buf = append(append(buf[:0], "error:"...), err.Error()...)
		}
		// Writers hold wmu: the groups are read without the lock.
		g := s.groups[base]
		if g != nil && g.stamp == string(buf) {
			continue // compared without a copy
		}
		stamp := string(buf)
		source := base
		if base == defaultKey {
			source = s.defaultFile
		}
		var e *entry
		if err == nil {
			e, err = readEntry(source, files, base == defaultKey)
		}
		if err != nil {
			rep.Refused = append(rep.Refused, Refusal{Source: source, Err: err})
			s.mu.Lock()
			if g == nil {
				s.groups[base] = &group{stamp: stamp}
			} else {
				g.stamp = stamp // keep its entry, retry once the files change again
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		if g != nil && g.entry != nil {
			s.unindex(g.entry)
			s.held--
		}
		s.held++
		s.groups[base] = &group{stamp: stamp, entry: e}
		if base == defaultKey {
			s.def = e
		} else {
			s.index(e)
		}
		s.mu.Unlock()
		rep.Loaded = append(rep.Loaded, source)
	}
	s.mu.Lock()
	for base, g := range s.groups {
		if seen[base] || g.external {
			continue
		}
		delete(s.groups, base)
		if g.entry == nil {
			continue
		}
		s.held--
		if base == defaultKey {
			s.def = nil
		} else {
			s.unindex(g.entry)
		}
		rep.Removed = append(rep.Removed, g.entry.source)
	}
	s.mu.Unlock()
	slices.Sort(rep.Loaded)
	slices.Sort(rep.Removed)
	return rep, nil
}

// Replace makes certs (name → chain and key, PEM) the certificates of
// source (as "consul"), next to the directory's: a new or changed one is
// validated and served from the next handshake, an invalid one refused
// (the one it would replace stays), one no longer in certs removed.
// Reported sources are "source:name".
func (s *Store) Replace(source string, certs map[string][]byte) Report {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var rep Report
	prefix := "\x00" + source + ":" // no path starts so
	now := time.Now()
	for name, data := range certs {
		base := prefix + name
		sum := sha256.Sum256(data)
		stamp := string(sum[:])
		g := s.groups[base]
		if g != nil && g.stamp == stamp {
			continue
		}
		id := source + ":" + name
		e, err := newEntry(id, data, false, now)
		s.mu.Lock()
		switch {
		case err != nil:
			rep.Refused = append(rep.Refused, Refusal{Source: id, Err: err})
			if g == nil {
				s.groups[base] = &group{stamp: stamp, external: true}
			} else {
				g.stamp = stamp
			}
		default:
			if g != nil && g.entry != nil {
				s.unindex(g.entry)
				s.held--
			}
			s.held++
			s.groups[base] = &group{stamp: stamp, entry: e, external: true}
			s.index(e)
			rep.Loaded = append(rep.Loaded, id)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	for base, g := range s.groups {
		name, ok := strings.CutPrefix(base, prefix)
		if !ok {
			continue
		}
		if _, keep := certs[name]; keep {
			continue
		}
		delete(s.groups, base)
		if g.entry != nil {
			s.held--
			s.unindex(g.entry)
			rep.Removed = append(rep.Removed, g.entry.source)
		}
	}
	s.mu.Unlock()
	slices.Sort(rep.Loaded)
	slices.Sort(rep.Removed)
	slices.SortFunc(rep.Refused, func(a, b Refusal) int { return strings.Compare(a.Source, b.Source) })
	return rep
}

// Check validates a certificate (chain and key, PEM) as the store would,
// and returns the DNS names it answers for and when it expires.
func Check(data []byte) (names []string, notAfter time.Time, err error) {
	e, err := newEntry("", data, false, time.Now())
	if err != nil {
		return nil, time.Time{}, err
	}
	c, err := e.certificate()
	if err != nil {
		return nil, time.Time{}, err
	}
	return e.names, c.Leaf.NotAfter, nil
}

// defaultKey is the default certificate's group: no base path looks so.
const defaultKey = "\x00default"

// appendStamp appends what identifies the files' contents cheaply: their
// names, sizes and modification times.
func appendStamp(b []byte, files []string) ([]byte, error) {
	if len(files) > 1 {
		slices.Sort(files)
	}
	for _, f := range files {
		fi, err := os.Stat(f) // follows symlinks (Kubernetes secret volumes)
		if err != nil {
			return b, err
		}
		b = append(b, filepath.Base(f)...)
		b = append(b, ':')
		b = strconv.AppendInt(b, fi.Size(), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, fi.ModTime().UnixNano(), 10)
		b = append(b, ';')
	}
	return b, nil
}

func readEntry(source string, files []string, isDefault bool) (*entry, error) {
	var data []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if len(b) > maxFileBytes {
			return nil, fmt.Errorf("%s: larger than %d bytes", f, maxFileBytes)
		}
		data = append(data, b...)
		data = append(data, '\n')
	}
	return newEntry(source, data, isDefault, time.Now())
}

// Validate checks that a client could use cert: at most MaxChainCerts
// certificates of at most MaxChainBytes of DER together, each signed by
// the next (the leaf first, then its issuer, and so on: a root at the
// end may be left out). The key matching the leaf is tls.X509KeyPair's
// check. The errors wrap ErrChain.
func Validate(cert *tls.Certificate) error {
	n, size := len(cert.Certificate), 0
	for _, der := range cert.Certificate {
		size += len(der)
	}
	if n > MaxChainCerts {
		return fmt.Errorf("%w: %d certificates (%d bytes); a client takes at most %d (the leaf and its intermediates, once each: is the file a concatenation gone wrong?)", ErrChain, n, size, MaxChainCerts)
	}
	if size > MaxChainBytes {
		return fmt.Errorf("%w: %d bytes of certificates; clients refuse a chain of more than %d", ErrChain, size, MaxChainBytes)
	}
	chain := make([]*x509.Certificate, n)
	for i, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("%w: certificate %d of %d: %v", ErrChain, i+1, n, err)
		}
		chain[i] = c
	}
	for i := 0; i+1 < n; i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return fmt.Errorf("%w: certificate %d of %d (%q) is not signed by the next one (%q): %v; the chain must run from the leaf to the root, each certificate followed by its issuer",
				ErrChain, i+1, n, chain[i].Subject.String(), chain[i+1].Subject.String(), err)
		}
	}
	return nil
}

// newEntry validates a chain and key and keeps their bytes.
func newEntry(source string, data []byte, isDefault bool, now time.Time) (*entry, error) {
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, err
	}
	if err := Validate(&cert); err != nil {
		return nil, err
	}
	leaf := cert.Leaf
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	e := &entry{source: source, pem: bytes.Clone(data), notBefore: leaf.NotBefore.Unix(), rank: 1}
	switch cert.PrivateKey.(type) {
	case *ecdsa.PrivateKey:
		e.rank = 0
	case *rsa.PrivateKey:
		e.rank = 2
	}
	for _, n := range leaf.DNSNames {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if n != "" && !slices.Contains(e.names, n) {
			e.names = append(e.names, n)
		}
	}
	if len(e.names) == 0 && !isDefault {
		return nil, errors.New("the leaf certificate names no DNS name (subject alternative names)")
	}
	return e, nil
}

// index and unindex need s.mu held for writing.
func (s *Store) index(e *entry) {
	for _, n := range e.names {
		m, key := s.slot(n)
		list := append(m[key], e)
		slices.SortStableFunc(list, func(a, b *entry) int {
			if a.rank != b.rank {
				return int(a.rank) - int(b.rank)
			}
			return int(b.notBefore - a.notBefore) // the newest first
		})
		m[key] = list
	}
}

func (s *Store) unindex(e *entry) {
	for _, n := range e.names {
		m, key := s.slot(n)
		list := slices.DeleteFunc(m[key], func(x *entry) bool { return x == e })
		if len(list) == 0 {
			delete(m, key)
		} else {
			m[key] = list
		}
	}
}

func (s *Store) slot(name string) (map[string][]*entry, string) {
	if parent, ok := strings.CutPrefix(name, "*."); ok {
		return s.wild, parent
	}
	return s.exact, name
}

// Certificate is the certificate for a handshake: the server name's own,
// else its parent domain's wildcard, else the default. Among several (ECDSA
// and RSA for one name) it picks the first the client supports. It returns
// nil, nil when nothing matches: crypto/tls then fails the handshake with an
// unrecognized_name alert.
func (s *Store) Certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	s.mu.RLock()
	var list []*entry
	if name != "" {
		list = s.exact[name]
		if len(list) == 0 {
			if i := strings.IndexByte(name, '.'); i > 0 {
				list = s.wild[name[i+1:]]
			}
		}
	}
	def := s.def
	s.mu.RUnlock()
	if len(list) == 0 {
		if def == nil {
			return nil, nil
		}
		return def.certificate()
	}
	if len(list) == 1 {
		return list[0].certificate()
	}
	var first *tls.Certificate
	for _, e := range list {
		c, err := e.certificate()
		if err != nil {
			continue
		}
		if hello.SupportsCertificate(c) == nil {
			return c, nil
		}
		if first == nil {
			first = c
		}
	}
	if first == nil {
		return nil, fmt.Errorf("certificates for %q fail to parse", name)
	}
	return first, nil // the handshake says what the client lacks
}

// certificate parses the entry on first use; concurrent first uses may
// both parse, one result stays.
func (e *entry) certificate() (*tls.Certificate, error) {
	if c := e.parsed.Load(); c != nil {
		return c, nil
	}
	c, err := tls.X509KeyPair(e.pem, e.pem)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", e.source, err)
	}
	e.parsed.Store(&c)
	return &c, nil
}
