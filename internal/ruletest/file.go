// Package ruletest runs rule tests: a file of requests, each with the rules
// that should apply to it, the keys they should count it by and what the
// limiter should decide over a run of such requests. A request goes
// through the same code the edge runs (package reqhead for the Host and
// the header lookups, internal/edge/trust for the screen and the client
// address, pkg/rules for matching and keys, pkg/limiter over a memory
// store for decisions), with time frozen, so a test says what the edge
// will do and means the same on any machine. Lint finds rules that can
// never do what they seem to.
package ruletest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// File is a rule test file.
type File struct {
	// Rules is the rules document under test, a path relative to the test
	// file; empty: the document being validated or pushed.
	Rules string `yaml:"rules"`
	// TrustedProxies are the edge's --trusted-proxies (addresses or CIDRs):
	// hops of X-Forwarded-For in them pass the question on.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// DefaultHost is the edge's --default-host ("": a request without a
	// Host is refused).
	DefaultHost string `yaml:"default_host"`
	// AllowMethods is the edge's --allow-methods: CONNECT and TRACE are
	// refused (405) unless named here.
	AllowMethods []string `yaml:"allow_methods"`
	// IPv6Prefix is the edge's --ipv6-prefix (default 64).
	IPv6Prefix int `yaml:"ipv6_prefix"`
	// Tests are the cases, run one after another, each against fresh
	// counters.
	Tests []Case `yaml:"tests"`

	trusted []netip.Prefix
}

// Case is one request, sent Repeat times, and what should come of it.
type Case struct {
	Name    string  `yaml:"name"`
	Request Request `yaml:"request"`
	// Repeat sends the request this many times (default 1, at most
	// MaxRepeat).
	Repeat int `yaml:"repeat"`
	// Every is the time between two of the requests on the test's frozen
	// clock (default 0: all at the same instant).
	Every Duration `yaml:"every"`
	// Expect is what should come of it; only what is given is checked.
	Expect Expect `yaml:"expect"`
}

// Request is a request as the edge receives it.
type Request struct {
	Method string `yaml:"method"` // default GET
	// Host is the Host field as sent ("": none).
	Host string `yaml:"host"`
	// Path is the request target as the client sent it: percent-escapes,
	// dot segments and query included, or an absolute-form URI.
	Path string `yaml:"path"`
	// Headers are fields as sent; a list sends the field once per value.
	Headers map[string]Values `yaml:"headers"`
	// Peer is the socket peer's address.
	Peer string `yaml:"peer"`
	// Trusted: the peer is a trusted proxy (as if it were in
	// --trusted-proxies), so its X-Forwarded-For and other forwarded
	// fields count.
	Trusted bool `yaml:"trusted"`
}

// Expect is what a case checks. Lists are compared in order.
type Expect struct {
	// Refused is the status the edge refuses the request with before the
	// limiter (400: no usable Host, a repeated header the rules read, or
	// a malformed request; 405: a refused method); 0: it is not refused.
	Refused int `yaml:"refused"`
	// Client is the client address the trust model names.
	Client string `yaml:"client"`
	// Matches are the ids of the rules that apply and count the request.
	Matches *[]string `yaml:"matches"`
	// Bypassed are the ids of the rules whose bypass names the request.
	Bypassed *[]string `yaml:"bypassed"`
	// Keys are, by rule id, the key the rule counts the request by: its
	// values (a list, one per descriptor, as in overrides) or the key
	// string itself.
	Keys map[string]Key `yaml:"keys"`
	// Allowed and Denied count the decisions over the Repeat requests.
	Allowed *int `yaml:"allowed"`
	Denied  *int `yaml:"denied"`
	// Status is the last request's status from the limiter: 429 when it
	// was denied, 200 when it went on to the origin.
	Status int `yaml:"status"`
	// Violated are the rules the last request's 429 names.
	Violated *[]string `yaml:"violated"`
}

// MaxRepeat bounds a case's requests and MaxRequests a file's: a test
// file runs in moments.
const (
	MaxRepeat   = 100_000
	MaxRequests = 1_000_000
)

// Values is one header value or a list of them.
type Values []string

// UnmarshalYAML takes a scalar or a list of scalars.
func (v *Values) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*v = Values{n.Value}
		return nil
	}
	var list []string
	if err := n.Decode(&list); err != nil {
		return err
	}
	*v = list
	return nil
}

// Key is an expected key: its values or the key string.
type Key struct {
	Parts []string
	Key   string
}

// UnmarshalYAML takes the key string or a list of values.
func (k *Key) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		k.Key = n.Value
		return nil
	}
	return n.Decode(&k.Parts)
}

// Duration is a time.Duration spelled as Go does ("250ms").
type Duration time.Duration

// UnmarshalYAML parses the text.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration (say \"250ms\", \"1s\")", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// Parse reads a test file strictly: unknown fields, a key given twice or
// a second document are errors with their line, and every case is checked
// before any runs (errors.Join of every problem).
func Parse(data []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the test file is empty")
		}
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("a test file holds one YAML document")
	}
	return &f, f.validate()
}

func (f *File) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, s := range f.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			bad("trusted_proxies: %q is not an address or CIDR", s)
			continue
		}
		f.trusted = append(f.trusted, p)
	}
	if f.IPv6Prefix < 0 || f.IPv6Prefix > 128 {
		bad("ipv6_prefix: must be 1-128, got %d", f.IPv6Prefix)
	}
	if len(f.Tests) == 0 {
		bad("tests: no cases")
	}
	names := map[string]bool{}
	total := 0
	for i := range f.Tests {
		c := &f.Tests[i]
		at := fmt.Sprintf("tests[%d]", i)
		if c.Name == "" {
			bad("%s: name is required", at)
		} else if names[c.Name] {
			bad("%s: name %q is given twice", at, c.Name)
		}
		names[c.Name] = true
		if c.Repeat == 0 {
			c.Repeat = 1
		}
		if c.Repeat < 0 || c.Repeat > MaxRepeat {
			bad("%s: repeat must be 1-%d, got %d", at, MaxRepeat, c.Repeat)
		} else if total += c.Repeat; total > MaxRequests && total-c.Repeat <= MaxRequests {
			bad("%s: the file's cases send more than %d requests in all", at, MaxRequests)
		}
		if err := c.Request.check(); err != nil {
			bad("%s: request: %v", at, err)
		}
		if e := c.Expect; e.Client != "" {
			if _, err := netip.ParseAddr(e.Client); err != nil {
				bad("%s: expect.client: %q is not an address", at, e.Client)
			}
		}
	}
	return errors.Join(errs...)
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// check refuses what could not be a request on the wire: the test would
// otherwise say something about bytes no client can send.
func (r *Request) check() error {
	if r.Method == "" {
		r.Method = "GET"
	}
	if !token(r.Method) {
		return fmt.Errorf("method %q is not an HTTP token", r.Method)
	}
	if r.Path == "" {
		return errors.New("path is required")
	}
	if strings.ContainsAny(r.Path, " \t\r\n\x00") {
		return fmt.Errorf("path %q holds white space or control characters", r.Path)
	}
	if strings.ContainsAny(r.Host, "\r\n\x00") {
		return fmt.Errorf("host %q holds control characters", r.Host)
	}
	if _, err := netip.ParseAddr(r.Peer); err != nil {
		return fmt.Errorf("peer %q is not an address", r.Peer)
	}
	for k, vs := range r.Headers {
		if !token(k) {
			return fmt.Errorf("header name %q is not an HTTP token", k)
		}
		if strings.EqualFold(k, "Host") {
			return errors.New("give the Host as host, not in headers")
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("header %s: value %q holds control characters", k, v)
			}
		}
	}
	return nil
}

// token reports whether s is an HTTP token (RFC 9110 §5.6.2).
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
