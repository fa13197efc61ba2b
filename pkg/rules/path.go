package rules

import "strings"

// NormalizePath returns the path that path_prefix rules match against, in a
// form a client cannot vary to sidestep a prefix rule:
//
//   - the query string and fragment are dropped (before decoding, so an
//     encoded "%3F" stays part of the path);
//   - percent-escapes are decoded once, including %2F and %2E; malformed
//     escapes are kept literally;
//   - repeated slashes collapse, "." and ".." segments are resolved (never
//     above the root), and a trailing slash is dropped;
//   - the result always starts with "/". Case is preserved.
//
// Decoding happens exactly once, as most origins do; "%252F" becomes the
// literal "%2F", not "/". NormalizePath never panics and does not allocate
// when raw is already normalized.
func NormalizePath(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if isCleanPath(raw) {
		return raw
	}
	// Most paths fit on the stack; longer ones spill to the heap via append.
	var stack [256]byte
	buf := append(stack[:0], '/')
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '%' && i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]) {
			c = unhex(raw[i+1])<<4 | unhex(raw[i+2])
			i += 2
		}
		buf = append(buf, c)
	}
	return string(cleanRooted(buf))
}

// isCleanPath reports whether p is already what NormalizePath would return,
// the common case on the hot path.
func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if p == "/" {
		return true
	}
	if p[len(p)-1] == '/' || strings.IndexByte(p, '%') >= 0 {
		return false
	}
	// Look at each segment start for "", "." or "..".
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		rest := p[i+1:]
		seg := rest
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			seg = rest[:j]
		}
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// cleanRooted is path.Clean for a buffer that starts with '/', done in place:
// the write index never passes the read index.
func cleanRooted(b []byte) []byte {
	n := len(b)
	w := 1 // b[0] is '/'
	for r := 1; r < n; {
		switch {
		case b[r] == '/':
			r++
		case b[r] == '.' && (r+1 == n || b[r+1] == '/'):
			r++
		case b[r] == '.' && r+1 < n && b[r+1] == '.' && (r+2 == n || b[r+2] == '/'):
			r += 2
			// Back up to the previous '/', but never above the root.
			for w > 1 {
				w--
				if b[w] == '/' {
					break
				}
			}
		default:
			if w > 1 {
				b[w] = '/'
				w++
			}
			for ; r < n && b[r] != '/'; r++ {
				b[w] = b[r]
				w++
			}
		}
	}
	return b[:w]
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}
