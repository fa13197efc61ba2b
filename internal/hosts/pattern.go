package hosts

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// NormalizePattern checks one host pattern and returns its canonical form,
// the one rules.NormalizeHost gives the request's Host: lower case, one
// trailing dot dropped, an IP literal in its canonical form without
// brackets. Two spellings of one host thus normalise alike and cannot land
// in two entries. A pattern is an exact name (or IP literal) or "*." and a
// name; nothing else: no port, scheme, path, bare "*", "*" elsewhere or
// empty label, and ASCII only (an internationalised name is written in its
// xn-- form, which is what clients send).
func NormalizePattern(raw string) (string, error) {
	p, err := normalizePattern(raw)
	if err != nil {
		return "", fmt.Errorf("%q: %w", raw, err)
	}
	return p, nil
}

func normalizePattern(raw string) (string, error) {
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c >= 0x80 || c < 0x20 || c == 0x7f {
			return "", errors.New("only printable ASCII (write an internationalised name in its xn-- form)")
		}
	}
	switch {
	case raw == "":
		return "", errors.New("empty host pattern")
	case raw == "*" || raw == "*.":
		return "", fmt.Errorf("a bare wildcard is not allowed (hosts the table does not name go to the %q pool)", DefaultPool)
	case strings.Contains(raw, "://"):
		return "", errors.New("a host pattern has no scheme")
	case strings.ContainsAny(raw, "/?#"):
		return "", errors.New("a host pattern has no path")
	}
	h := strings.ToLower(raw)
	wildcard := strings.HasPrefix(h, "*.")
	name := h
	if wildcard {
		name = h[2:]
	}
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		name = name[1 : len(name)-1]
	}
	if addr, ok := parseIP(name); ok {
		switch {
		case wildcard:
			return "", errors.New("a wildcard cannot apply to an IP address")
		case addr.Zone() != "":
			return "", errors.New("IPv6 zones are not allowed")
		}
		return addr.String(), nil
	}
	name = strings.TrimSuffix(name, ".")
	if err := checkHostname(name); err != nil {
		return "", err
	}
	if wildcard {
		return "*." + name, nil
	}
	return name, nil
}

// parseIP is netip.ParseAddr, tried only on what may be an address: with
// a colon (IPv6), or digits and dots alone (IPv4).
func parseIP(name string) (netip.Addr, bool) {
	if strings.IndexByte(name, ':') < 0 && strings.Trim(name, "0123456789.") != "" {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(name)
	return addr, err == nil
}

func checkHostname(name string) error {
	switch {
	case name == "":
		return errors.New("empty host name")
	case len(name) > 253:
		return errors.New("host name longer than 253 characters")
	case strings.Contains(name, "*"):
		return errors.New(`a wildcard is only allowed as a leading "*."`)
	case strings.Contains(name, ":"):
		return errors.New("must not contain a port (hosts are matched without their port)")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("labels must be 1-63 characters")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("invalid character %q", c)
			}
		}
	}
	return nil
}
