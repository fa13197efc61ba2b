package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// NormalizeHostPattern checks a host pattern as match.hosts entries are
// checked (an exact name or IP literal, or "*." and a name) and returns its
// canonical form, the one NormalizeHost gives a request's Host: other
// documents naming hosts (the shedder's host weights) use it so that two
// spellings of one host cannot name two entries.
func NormalizeHostPattern(raw string) (string, error) { return normalizeHostPattern(raw) }

// normalizeHostPattern validates one match.hosts entry and returns its
// canonical form: lower case, no trailing dot, IP literals without brackets.
func normalizeHostPattern(raw string) (string, error) {
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
			return "", fmt.Errorf("%q: a wildcard cannot apply to an IP address", raw)
		case addr.Zone() != "":
			return "", fmt.Errorf("%q: IPv6 zones are not allowed", raw)
		}
		return addr.String(), nil
	}
	name = strings.TrimSuffix(name, ".")
	if err := checkHostname(name); err != nil {
		return "", fmt.Errorf("%q: %w", raw, err)
	}
	if wildcard {
		return "*." + name, nil
	}
	return name, nil
}

// parseIP is netip.ParseAddr, not tried on what it cannot take: a name
// with neither a colon (IPv6) nor only digits and dots (IPv4). Most hosts
// are names, and trying them as addresses costs an error each.
func parseIP(name string) (netip.Addr, bool) {
	if strings.IndexByte(name, ':') < 0 && strings.Trim(name, "0123456789.") != "" {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(name)
	return addr, err == nil
}

func checkHostname(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	if len(name) > 253 {
		return fmt.Errorf("host name longer than 253 characters")
	}
	if strings.Contains(name, "*") {
		return fmt.Errorf("a wildcard is only allowed as a leading \"*.\"")
	}
	if strings.Contains(name, ":") {
		return fmt.Errorf("must not contain a port (the edge matches hosts without ports)")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("labels must be 1-63 characters")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !isAlnum(c) && c != '-' && c != '_' {
				return fmt.Errorf("invalid character %q", c)
			}
		}
	}
	return nil
}

// NormalizeHost turns a Host header (or :authority) into the form
// Request.Host expects: lower case, port stripped, IPv6 brackets removed and
// one trailing dot dropped, so "API.example.com.:443" cannot sidestep a rule
// for "api.example.com". It does not allocate when the input is already
// normalized.
func NormalizeHost(raw string) string {
	h := raw
	if strings.HasPrefix(h, "[") {
		if end := strings.IndexByte(h, ']'); end > 0 {
			if addr, err := netip.ParseAddr(h[1:end]); err == nil {
				return addr.WithZone("").String()
			}
			h = h[1:end]
		}
	} else if i := strings.IndexByte(h, ':'); i >= 0 && strings.IndexByte(h[i+1:], ':') < 0 {
		h = h[:i] // host:port; several colons would be a bare IPv6 address
	}
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}
