// Package pathsem normalises a request path the way a given kind of origin
// reads it, so that a path_prefix rule sees the path the origin will act on,
// and reports paths whose meaning differs between kinds of origin.
//
// The edge's own form (rules.NormalizePath, "rfc3986" here) decodes once and
// resolves dot segments. Origins read more into a path than that:
//
//   - Servlet containers (Tomcat, Jetty, and Spring Boot, which embeds
//     Tomcat) take ";name=value" path parameters off every segment before
//     they decode it, so "/api;x/y" is served as "/api/y" and
//     "/public/..;/api/x" as "/api/x" (Tomcat; Jetty 9.4 answers 400 to a
//     ".." with parameters). An encoded "%3B" is data, not a parameter.
//     Jetty 9.4 also decodes "%uXXXX", treats a decoded "%2F" as a separator,
//     reads the escapes of a path whose decoded bytes are not UTF-8 as
//     ISO-8859-1, and
//     takes ':', ';', '<', '=', '>', '?', '@' and '`' as hex digits ("%2>"
//     is '.', so "/a/%2>%2>/b" is "/b"); Tomcat answers 400 to all of these,
//     to "%5C" and "\", and to characters RFC 3986 leaves out of a path
//     ('"', '<', '{', '|', ...).
//   - Case-insensitive origins (IIS's static file handler, which upper-cases
//     the name it looks up; files on NTFS, which compares names through the
//     volume's Unicode upcase table; ASP.NET routing, which compares with
//     ordinal case-insensitive matching) serve "/API/x" as "/api/x". Two
//     names are the same there when their Unicode simple upper-case
//     mappings are equal; that is not ASCII-only ("/ÄPI" is "/äpi") and not
//     Unicode case folding (the Kelvin sign U+212A upper-cases to itself, so
//     it is not "k").
//   - Windows path handling takes '\' as a separator like '/' and drops
//     trailing dots and spaces from names, so "/api./x" and "/api%20/x" reach
//     "/api/x". (Win32 drops every trailing dot and space from the last
//     segment and one trailing dot from the others; the model drops them from
//     every segment, which folds more paths together, never fewer.)
//
// Normalize applies these steps in this order (each only where its semantics
// asks for it; the order is the servlet containers', checked against them):
//
//  1. The query and fragment are cut off at the first raw '?' or '#'
//     (servlet: not a '?' inside one of Jetty's lenient escapes, "%2?").
//  2. Servlet: ";..." parameters are cut from every raw segment (up to the
//     next raw '/', or '\' with Windows), before decoding; but a path with
//     parameters in its last segment only and nothing else to decode or
//     resolve is cut at its last ';' and not decoded, as Jetty does (see
//     lastParameterOnly).
//  3. Percent-escapes are decoded once; a malformed escape stays literal
//     (servlet: hex digits as Jetty reads them, see hexValue).
//     "%2F" becomes '/', a separator from then on (Jetty). Servlet and
//     Windows also decode "%uXXXX" (Jetty; IIS did historically, which is
//     not verified here). Servlet: when the decoded bytes are not valid
//     UTF-8 (overlong forms such as "%C0%AF", surrogates, stray bytes), the
//     escapes are read again as ISO-8859-1, one rune each, as Jetty does.
//  4. Windows: '\' (raw or decoded) becomes '/'.
//  5. Windows: trailing dots and spaces are dropped from every segment
//     other than "." and ".." (those are resolved first, as Win32 does).
//  6. "." and ".." segments are resolved, never above the root, and empty
//     segments (repeated slashes) dropped; a trailing slash is dropped and
//     the result starts with "/". Tomcat drops empty segments first, Jetty
//     lets a ".." remove one ("/a//../b" is "/b" at Tomcat, "/a/b" at
//     Jetty, and ambiguous): servlet resolves as Jetty does, since Tomcat
//     refuses much that Jetty serves ('"//..', "%2F../") and then only
//     Jetty's answer is an origin's; but as Tomcat does when a "." or ".."
//     segment has parameters, which Jetty refuses ("/0//..;" is "/").
//  7. Case-insensitive: every letter is mapped to the lower-case member of
//     its upper-case class (see foldRune), so a rule written in lower case
//     matches.
//
// The second result, ambiguous, reports that the raw path holds something
// origins of different kinds read differently (a ';' anywhere, '\' or
// "%5C", "%2F", "%00", "%u", a malformed escape, decoded bytes that are not
// UTF-8, a segment ending in '.' or ' ', a ".." above the root or right
// after an empty segment, a double escape such as "%252e", a raw '#', a raw
// byte RFC 3986 leaves out of paths, or a target not starting with '/').
// Case is never ambiguous: it is the case-insensitive semantics' business.
//
// A request target in absolute form ("http://host/path") is not a path: the
// caller takes the path out of it first.
package pathsem

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Semantics is a set of the ways an origin reads paths; the zero value is
// RFC3986, the edge's own reading.
type Semantics uint8

const (
	// RFC3986 decodes once and resolves dot segments, nothing more.
	RFC3986 Semantics = 0
	// Servlet cuts ";" path parameters from segments (Tomcat, Jetty).
	Servlet Semantics = 1 << iota
	// CaseInsensitive compares paths without regard to letter case (IIS).
	CaseInsensitive
	// Windows takes '\' as a separator and ignores trailing dots and spaces.
	Windows
)

var names = []struct {
	s    Semantics
	name string
}{
	{Servlet, "servlet"},
	{CaseInsensitive, "case-insensitive"},
	{Windows, "windows"},
}

// ErrUnknown is returned by Parse for a name it does not know.
var ErrUnknown = errors.New("unknown path semantics")

// Parse reads "rfc3986" or names joined by '+': "servlet",
// "case-insensitive", "windows" (e.g. "servlet+case-insensitive").
func Parse(s string) (Semantics, error) {
	if s == "rfc3986" {
		return RFC3986, nil
	}
	var out Semantics
	for part := range strings.SplitSeq(s, "+") {
		found := false
		for _, n := range names {
			if part == n.name {
				if out&n.s != 0 {
					return 0, fmt.Errorf("path semantics %q: %q given twice", s, part)
				}
				out |= n.s
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("path semantics %q: %w %q (want rfc3986, servlet, case-insensitive, windows, joined by '+')", s, ErrUnknown, part)
		}
	}
	return out, nil
}

// String is the form Parse reads.
func (s Semantics) String() string {
	if s == RFC3986 {
		return "rfc3986"
	}
	var parts []string
	for _, n := range names {
		if s&n.s != 0 {
			parts = append(parts, n.name)
		}
	}
	if rest := s &^ (Servlet | CaseInsensitive | Windows); rest != 0 {
		parts = append(parts, fmt.Sprintf("0x%02x", uint8(rest)))
	}
	return strings.Join(parts, "+")
}

// Normalize returns the path an origin of semantics s acts on for the raw
// request path, in the form rules match (see the package comment for the
// steps), and whether the raw path is ambiguous between kinds of origin.
// It never panics and does not allocate when raw is already in that form.
func Normalize(raw string, s Semantics) (path string, ambiguous bool) {
	if i := queryIndex(raw, s&Servlet != 0); i >= 0 {
		ambiguous = raw[i] == '#'
		raw = raw[:i]
	}
	if !ambiguous && isClean(raw, s) {
		return raw, false
	}
	p, amb := normalizeSlow(raw, s)
	return p, amb || ambiguous
}

// queryStart is strings.IndexAny(raw, "?#") by two byte searches:
// IndexAny tests a short string's bytes one by one against the set, and
// this runs for every request's path.
func queryStart(raw string) int {
	i := strings.IndexByte(raw, '?')
	head := raw
	if i >= 0 {
		head = raw[:i]
	}
	if j := strings.IndexByte(head, '#'); j >= 0 {
		return j
	}
	return i
}

// queryIndex is where the query or fragment starts in raw, or -1. With
// lenient (servlet), a '?' that Jetty's lenient escapes take as a hex digit
// ("%2?" is '/') is part of the path.
func queryIndex(raw string, lenient bool) int {
	i := queryStart(raw)
	if i < 0 || !lenient || strings.IndexByte(raw[:i], '%') < 0 {
		return i
	}
	inParam := false // Jetty reads no escape in a parameter
	for j := 0; j < len(raw); j++ {
		switch raw[j] {
		case ';':
			inParam = true
		case '/':
			inParam = false
		case '%':
			if _, n, _, ok := decodeEscape(raw[j:], true, true); ok && !inParam {
				j += n - 1
			}
		case '?', '#':
			return j
		}
	}
	return -1
}

// isClean reports whether p is already Normalize's answer and not
// ambiguous: ASCII letters, digits and the path characters RFC 3986 allows
// apart from ';' and '%', no empty, ".", or ".." segment, no segment ending
// in '.', no trailing slash, and no upper-case letter for CaseInsensitive.
func isClean(p string, s Semantics) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if p == "/" {
		return true
	}
	upperOK := s&CaseInsensitive == 0
	prev := byte('/')
	for i := 1; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			if prev == '/' || prev == '.' {
				return false
			}
		case 'A' <= c && c <= 'Z':
			if !upperOK {
				return false
			}
		case pathChar[c]:
		default:
			return false
		}
		prev = c
	}
	return prev != '/' && prev != '.'
}

// pathChar holds the bytes RFC 3986 allows raw in a path segment other than
// ';' (a parameter to servlet containers) and '%' (an escape):
// unreserved, sub-delims, ':' and '@'. The letters are here too.
var pathChar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~!$&'()*+,=:@" {
		t[c] = true
	}
	return t
}()

func normalizeSlow(raw string, s Semantics) (string, bool) {
	servlet, windows := s&Servlet != 0, s&Windows != 0
	amb := raw == "" || raw[0] != '/'
	literal := false
	if servlet {
		if end := lastParameterOnly(raw); end >= 0 {
			raw, literal, amb = raw[:end], true, true
		}
	}
	// Most paths fit on the stack; longer ones spill to the heap via append.
	var stack [256]byte
	buf, decAmb, dotParam := decodePath(append(stack[:0], '/'), raw, servlet, windows, literal, false)
	amb = amb || decAmb
	if !utf8.Valid(buf) {
		amb = true
		if servlet {
			// Jetty reads the escapes again as ISO-8859-1, each a rune;
			// what is still not UTF-8 then came raw (refused by both).
			buf, _, _ = decodePath(buf[:1], raw, servlet, windows, literal, true)
			if !utf8.Valid(buf) {
				buf = latin1(buf)
			}
		}
	}
	if windows {
		for i, c := range buf {
			if c == '\\' {
				buf[i] = '/'
			}
		}
	}
	if servlet && !dotParam && bytes.Contains(buf[1:], []byte("//")) { // buf[0] is the root, raw's own "/" follows
		var emptyAmb bool
		buf, emptyAmb = resolveKeepingEmpty(buf)
		amb = amb || emptyAmb
	}
	buf, cleanAmb := cleanRooted(buf, windows)
	amb = amb || cleanAmb
	if s&CaseInsensitive != 0 {
		buf = foldCase(buf)
	}
	return string(buf), amb
}

// decodePath appends raw to buf with parameters cut (servlet, unless
// literal) and escapes decoded (unless literal), each decoded byte above
// 0x7f as an ISO-8859-1 rune with latin. It reports ambiguity and whether a
// "." or ".." segment had parameters (Jetty refuses those).
func decodePath(buf []byte, raw string, servlet, windows, literal, latin bool) (out []byte, amb, dotParam bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case literal && (c == ';' || c == '%'):
		case c == ';':
			amb = true
			if servlet {
				seg := buf[bytes.LastIndexByte(buf, '/')+1:]
				dotParam = dotParam || string(seg) == "." || string(seg) == ".."
				for i+1 < len(raw) && raw[i+1] != '/' && !(windows && raw[i+1] == '\\') {
					i++
				}
				continue
			}
		case c == '%':
			d, n, escAmb, ok := decodeEscape(raw[i:], servlet || windows, servlet)
			amb = amb || escAmb
			if ok {
				if latin && len(d) == 1 && d[0] >= utf8.RuneSelf {
					buf = utf8.AppendRune(buf, rune(d[0]))
				} else {
					buf = append(buf, d...)
				}
				i += n - 1
				continue
			}
		case c == '/' || pathChar[c]:
		default:
			amb = true // '\\', '"', '<', '{', space, controls, raw non-ASCII, ...
		}
		buf = append(buf, c)
	}
	return buf, amb, dotParam
}

// lastParameterOnly is where Jetty 9 ends a path that has parameters only
// in its last segment and otherwise nothing to decode or resolve (no '%'
// and no segment starting with '.' before the first ';'): it cuts the path
// at the last ';' and leaves the rest as it is, undecoded ("/a;b;c" is
// "/a;b", "/a/b;c%41;d" is "/a/b;c%41"; Tomcat gives "/a" and "/a/b").
// It returns -1 for any other path, which Jetty decodes and strips as
// Tomcat does.
func lastParameterOnly(raw string) int {
	first := strings.IndexByte(raw, ';')
	if first < 0 || strings.IndexByte(raw[first:], '/') >= 0 ||
		strings.IndexByte(raw[:first], '%') >= 0 || strings.Contains(raw[:first], "/.") {
		return -1
	}
	return strings.LastIndexByte(raw, ';')
}

// decodeEscape decodes the escape at the start of e ("%XX", or "%uXXXX" when
// decodeU): the bytes, how many of e it used, whether the escape is
// ambiguous, and false when it is no escape at all (kept literally). With
// lenient, hex digits are read as Jetty reads them (hexValue).
func decodeEscape(e string, decodeU, lenient bool) (d []byte, n int, amb, ok bool) {
	if len(e) >= 6 && e[1] == 'u' {
		var r rune
		valid := true
		for k := 2; k < 6 && valid; k++ {
			v, ok := hexValue(e[k], lenient)
			r, valid = r<<4|rune(v), ok
		}
		if valid {
			if !decodeU {
				return nil, 0, true, false
			}
			// "%uXXXX" is a UTF-16 code unit: a high surrogate and a low one
			// make one rune; a lone surrogate has no UTF-8 form and becomes
			// U+FFFD (Jetty keeps it in a Java string).
			if 0xd800 <= r && r < 0xdc00 && len(e) >= 12 && e[6] == '%' && e[7] == 'u' {
				var l rune
				lowOK := true
				for k := 8; k < 12 && lowOK; k++ {
					v, ok := hexValue(e[k], lenient)
					l, lowOK = l<<4|rune(v), ok
				}
				if lowOK && 0xdc00 <= l && l <= 0xdfff {
					return utf8.AppendRune(nil, 0x10000+(r-0xd800)<<10+(l-0xdc00)), 12, true, true
				}
			}
			return utf8.AppendRune(nil, r), 6, true, true
		}
	}
	if len(e) < 3 {
		return nil, 0, true, false
	}
	hi, ok1 := hexValue(e[1], lenient)
	lo, ok2 := hexValue(e[2], lenient)
	if !ok1 || !ok2 {
		return nil, 0, true, false
	}
	amb = !isHex(e[1]) || !isHex(e[2])
	c := hi<<4 | lo
	switch c {
	case '/', '\\', 0:
		amb = true
	case '%':
		// "%25" followed by what reads as an escape: a second decoding
		// (IIS refuses double escapes) would read it differently.
		amb = amb || len(e) >= 5 && (isHex(e[3]) && isHex(e[4]) || e[3] == 'u' || e[3] == 'U')
	}
	return escByte[int(c) : int(c)+1], 3, amb, true
}

// hexValue is c's value as a hex digit. With lenient it is Jetty 9's
// arithmetic, (c&0x1f) + (c>>6)*0x19 - 0x10 when that is 0 to 15, which
// also takes ':', ';', '<', '=', '>', '?', '@', '`' and the control bytes
// 0x10 to 0x1f: Jetty serves "/a/%2>%2>/b" as "/b" (Tomcat refuses it).
func hexValue(c byte, lenient bool) (byte, bool) {
	if isHex(c) {
		return unhex(c), true
	}
	if !lenient {
		return 0, false
	}
	d := int(c&0x1f) + int(c>>6)*0x19 - 0x10
	if d < 0 || d > 15 {
		return 0, false
	}
	return byte(d), true
}

// escByte lets decodeEscape return one byte without allocating.
var escByte = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
	}
	return t
}()

// latin1 re-reads b as ISO-8859-1, each byte one rune, so that the servlet
// answer is UTF-8 even for raw bytes that are not (both containers refuse
// those).
func latin1(b []byte) []byte {
	out := make([]byte, 0, len(b)*2)
	for _, c := range b {
		out = utf8.AppendRune(out, rune(c))
	}
	return out
}

// cleanRooted resolves dot segments and drops empty ones in b (which starts
// with '/'), in place: the write index never passes the read index. With
// trim, trailing dots and spaces are dropped from every segment first. It
// reports ambiguity: a ".." above the root or right after an empty segment
// (Tomcat drops the empty segment first, Jetty pops it), or a segment other
// than "." and ".." ending in '.' or ' '.
func cleanRooted(b []byte, trim bool) ([]byte, bool) {
	n := len(b)
	w := 1 // b[0] is '/'
	amb := false
	emptyBefore := false
	for r := 1; r < n; {
		end := r
		for end < n && b[end] != '/' {
			end++
		}
		seg := b[r:end]
		next := end + 1
		switch {
		case len(seg) == 0:
			emptyBefore = true
			r = next
			continue
		case string(seg) == ".":
			r = next // "//./.." is still ".." after an empty segment
			continue
		case string(seg) == "..":
			if w == 1 || emptyBefore {
				amb = true
			}
			// Back up to the previous '/', but never above the root.
			for w > 1 {
				w--
				if b[w] == '/' {
					break
				}
			}
		default:
			if last := seg[len(seg)-1]; last == '.' || last == ' ' {
				amb = true
				if trim {
					for len(seg) > 0 && (seg[len(seg)-1] == '.' || seg[len(seg)-1] == ' ') {
						seg = seg[:len(seg)-1]
					}
					if len(seg) == 0 {
						r = next
						continue
					}
				}
			}
			if w > 1 {
				b[w] = '/'
				w++
			}
			w += copy(b[w:], seg)
		}
		emptyBefore = false
		r = next
	}
	return b[:w], amb
}

// resolveKeepingEmpty resolves "." and ".." segments of b (which starts
// with '/') taking empty segments as segments, as Jetty does; empty
// segments are left for cleanRooted to drop. It reports ambiguity: a ".."
// that removed an empty segment (Tomcat would have removed the name
// before it) or found nothing to remove (above the root).
func resolveKeepingEmpty(b []byte) ([]byte, bool) {
	segs := strings.Split(string(b[1:]), "/")
	out := segs[:0]
	amb := false
	for _, seg := range segs {
		switch seg {
		case ".":
		case "..":
			if len(out) == 0 || out[len(out)-1] == "" {
				amb = true
			}
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
		}
	}
	return append(b[:1], strings.Join(out, "/")...), amb
}

// foldCase maps every letter of the UTF-8 path b to foldRune's
// representative, in place for ASCII.
func foldCase(b []byte) []byte {
	ascii := true
	for i, c := range b {
		if c >= utf8.RuneSelf {
			ascii = false
			break
		}
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	if ascii {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			out = append(out, b[i]) // not UTF-8 (RFC3986 keeps such bytes)
		} else {
			out = utf8.AppendRune(out, foldRune(r))
		}
		i += size
	}
	return out
}

// foldRune returns one member of r's class, the runes with the same simple
// upper-case mapping (how NTFS and ordinal case-insensitive comparison
// match names): the lower-case form when it maps back to the same upper
// case, else the upper case itself. 'K' and 'k' give 'k'; the Kelvin sign
// U+212A stays itself, since 'k' upper-cases to 'K', not to it.
func foldRune(r rune) rune {
	u := unicode.ToUpper(r)
	if l := unicode.ToLower(u); unicode.ToUpper(l) == u {
		return l
	}
	return u
}

// AppendEscaped appends path, a decoded path such as Normalize returns,
// to dst in a form that reads back as path once decoded: every byte but
// '/' and the path characters RFC 3986 allows raw, other than ';' and
// '%', is percent-escaped. So a '?', '#', ';', '%' or space in a segment
// stays data at the origin, not a query, fragment, parameter or escape.
func AppendEscaped(dst []byte, path string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c == '/' || pathChar[c] {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return dst
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
