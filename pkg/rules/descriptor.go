package rules

import (
	"fmt"
	"strings"
)

// descKind is what a key descriptor reads from the request.
type descKind uint8

const (
	descIP descKind = iota + 1
	descHost
	descMethod
	descPath
	descHeader
	descQuery
	descJA4
)

const descriptorList = "ip, host, method, path, header:<Name>, query:<name>, ja4"

// descriptor is one parsed element of Rule.Key.
type descriptor struct {
	kind descKind
	name string // header (canonical) or query parameter name
}

func (d descriptor) String() string {
	switch d.kind {
	case descIP:
		return "ip"
	case descHost:
		return "host"
	case descMethod:
		return "method"
	case descPath:
		return "path"
	case descHeader:
		return "header:" + d.name
	case descQuery:
		return "query:" + d.name
	case descJA4:
		return "ja4"
	}
	return "invalid"
}

// parseDescriptor is strict about spelling ("ip", not "IP") so each
// descriptor has exactly one form and document versions stay comparable.
// Header names are the exception: HTTP says they are case-insensitive, so
// they are canonicalized rather than rejected.
func parseDescriptor(s string) (descriptor, error) {
	switch s {
	case "ip":
		return descriptor{kind: descIP}, nil
	case "host":
		return descriptor{kind: descHost}, nil
	case "method":
		return descriptor{kind: descMethod}, nil
	case "ja4":
		return descriptor{kind: descJA4}, nil
	case "path":
		return descriptor{kind: descPath}, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == "header":
		if !isToken(name) {
			return descriptor{}, fmt.Errorf("%q: header name must be a non-empty HTTP token", s)
		}
		return descriptor{kind: descHeader, name: canonicalHeader(name)}, nil
	case ok && kind == "query":
		if !validQueryName(name) {
			return descriptor{}, fmt.Errorf("%q: query parameter name must be non-empty, without spaces, control characters, '&', '=' or '#'", s)
		}
		return descriptor{kind: descQuery, name: name}, nil
	}
	return descriptor{}, fmt.Errorf("unknown descriptor %q (want one of %s)", s, descriptorList)
}

func validQueryName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == 0x7f || c == '&' || c == '=' || c == '#' {
			return false
		}
	}
	return true
}

// canonicalHeader upper-cases the first letter and each letter after '-',
// like net/textproto, without importing a network package.
func canonicalHeader(s string) string {
	b := []byte(s)
	upper := true
	for i, c := range b {
		switch {
		case upper && 'a' <= c && c <= 'z':
			b[i] = c - ('a' - 'A')
		case !upper && 'A' <= c && c <= 'Z':
			b[i] = c + ('a' - 'A')
		}
		upper = c == '-'
	}
	return string(b)
}
