package pathsem

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

var (
	servletCI = Servlet | CaseInsensitive
	iis       = Windows | CaseInsensitive
)

func TestNormalize(t *testing.T) {
	type want struct {
		path string
		amb  bool
	}
	for _, tc := range []struct {
		name, raw string
		want      map[Semantics]want
	}{
		{"clean", "/api/x", map[Semantics]want{RFC3986: {"/api/x", false}, Servlet: {"/api/x", false}, CaseInsensitive: {"/api/x", false}, Windows: {"/api/x", false}}},
		{"root", "/", map[Semantics]want{RFC3986: {"/", false}, iis: {"/", false}}},
		{"empty", "", map[Semantics]want{RFC3986: {"/", true}}},
		{"dot dot semicolon", "/public/..;/api/x", map[Semantics]want{RFC3986: {"/public/..;/api/x", true}, Servlet: {"/api/x", true}}},
		{"parameter", "/api;x/y", map[Semantics]want{RFC3986: {"/api;x/y", true}, Servlet: {"/api/y", true}, servletCI: {"/api/y", true}}},
		{"encoded semicolon is data", "/api%3bx/y", map[Semantics]want{RFC3986: {"/api;x/y", false}, Servlet: {"/api;x/y", false}}},
		{"parameter in the last segment", "/a;jsessionid=1", map[Semantics]want{Servlet: {"/a", true}}},
		{"parameters in every segment", "/a;x/b;c=d;e/f;", map[Semantics]want{Servlet: {"/a/b/f", true}}},
		{"parameters in the last segment only", "/a/b;c%41;d", map[Semantics]want{RFC3986: {"/a/b;cA;d", true}, Servlet: {"/a/b;c%41", true}}},
		{"bare semicolon segment", "/;x/a", map[Semantics]want{Servlet: {"/a", true}}},
		{"dot with parameter", "/a/.;x/b", map[Semantics]want{Servlet: {"/a/b", true}}},
		{"encoded dots with parameter", "/a/%2e%2e;x/b", map[Semantics]want{Servlet: {"/b", true}}},
		{"backslash", `/api\x`, map[Semantics]want{RFC3986: {`/api\x`, true}, Servlet: {`/api\x`, true}, Windows: {"/api/x", true}}},
		{"encoded backslash", "/api%5cx", map[Semantics]want{RFC3986: {`/api\x`, true}, Windows: {"/api/x", true}}},
		{"backslash dot dot", `/a\..\b`, map[Semantics]want{RFC3986: {`/a\..\b`, true}, Windows: {"/b", true}}},
		{"encoded slash", "/api%2fx", map[Semantics]want{RFC3986: {"/api/x", true}, Servlet: {"/api/x", true}}},
		{"encoded slash dot dot", "/a%2f..%2fb", map[Semantics]want{RFC3986: {"/b", true}}},
		{"percent u", "/api%u002fx", map[Semantics]want{RFC3986: {"/api%u002fx", true}, Servlet: {"/api/x", true}, Windows: {"/api/x", true}}},
		{"percent u letter", "/%u0041pi", map[Semantics]want{RFC3986: {"/%u0041pi", true}, Servlet: {"/Api", true}, iis: {"/api", true}}},
		{"overlong slash", "/api%c0%afx", map[Semantics]want{RFC3986: {"/api\xc0\xafx", true}, Servlet: {"/api\u00c0\u00afx", true}}},
		{"stray byte", "/a%ffb", map[Semantics]want{Servlet: {"/a\u00ffb", true}}},
		{"lenient hex dots", "/public/%2>%2>/api/x", map[Semantics]want{RFC3986: {"/public/%2>%2>/api/x", true}, Servlet: {"/api/x", true}}},
		{"lenient hex takes a semicolon", "/a%3;x/b", map[Semantics]want{RFC3986: {"/a%3;x/b", true}, Servlet: {"/a;x/b", true}}},
		{"lenient hex takes a question mark", "/a%2?x", map[Semantics]want{RFC3986: {"/a%2", true}, Servlet: {"/a/x", true}}},
		{"percent u surrogate pair", "/a%ud83d%ude00", map[Semantics]want{RFC3986: {"/a%ud83d%ude00", true}, Servlet: {"/a\U0001F600", true}}},
		{"percent u lone surrogate", "/a%ud800b", map[Semantics]want{Servlet: {"/a\uFFFDb", true}}},
		{"upper-case percent U", "/%U0041", map[Semantics]want{Servlet: {"/%U0041", true}}},
		{"NUL", "/api%00x", map[Semantics]want{RFC3986: {"/api\x00x", true}}},
		{"malformed escape", "/a%zzb", map[Semantics]want{RFC3986: {"/a%zzb", true}}},
		{"truncated escape", "/a%", map[Semantics]want{RFC3986: {"/a%", true}}},
		{"double escape", "/a/%252e%252e/b", map[Semantics]want{RFC3986: {"/a/%2e%2e/b", true}}},
		{"escaped percent", "/100%25", map[Semantics]want{RFC3986: {"/100%", false}}},
		{"trailing dot", "/api./x", map[Semantics]want{RFC3986: {"/api./x", true}, Servlet: {"/api./x", true}, Windows: {"/api/x", true}}},
		{"trailing space", "/api%20/x", map[Semantics]want{RFC3986: {"/api /x", true}, Windows: {"/api/x", true}}},
		{"trailing dots and spaces", "/api.%20.%20/x", map[Semantics]want{Windows: {"/api/x", true}}},
		{"three dots", "/a/.../b", map[Semantics]want{RFC3986: {"/a/.../b", true}, Windows: {"/a/b", true}}},
		{"dot dot space", "/a/..%20/b", map[Semantics]want{RFC3986: {"/a/.. /b", true}, Windows: {"/a/b", true}}},
		{"upper case", "/API/x", map[Semantics]want{RFC3986: {"/API/x", false}, Servlet: {"/API/x", false}, CaseInsensitive: {"/api/x", false}, servletCI: {"/api/x", false}}},
		{"unicode upper case", "/%C3%84PI", map[Semantics]want{RFC3986: {"/ÄPI", false}, CaseInsensitive: {"/äpi", false}}},
		{"kelvin sign", "/%E2%84%AAey", map[Semantics]want{RFC3986: {"/\u212aey", false}, CaseInsensitive: {"/\u212aey", false}}},
		{"ASCII K is k, unlike the Kelvin sign", "/Key", map[Semantics]want{CaseInsensitive: {"/key", false}}},
		{"dotless i upper-cases to I", "/%C4%B1", map[Semantics]want{CaseInsensitive: {"/i", false}}},
		{"fragment", "/a#b", map[Semantics]want{RFC3986: {"/a", true}, Servlet: {"/a", true}}},
		{"encoded fragment", "/a%23b", map[Semantics]want{RFC3986: {"/a#b", false}}},
		{"query", "/a/b/?x=/../c", map[Semantics]want{RFC3986: {"/a/b", false}}},
		{"dot segments", "/a/./b/../c/", map[Semantics]want{RFC3986: {"/a/c", false}, Servlet: {"/a/c", false}}},
		{"encoded dot segments", "/a/%2e%2E/b", map[Semantics]want{RFC3986: {"/b", false}}},
		{"above the root", "/../a", map[Semantics]want{RFC3986: {"/a", true}, Servlet: {"/a", true}}},
		{"dot dot after empty segment", "/a//../b", map[Semantics]want{RFC3986: {"/b", true}, Servlet: {"/a/b", true}}},
		{"dot dot after empty segment above the root", "//../a", map[Semantics]want{RFC3986: {"/a", true}, Servlet: {"/a", true}}},
		{"encoded slash before dot dot", "/a/%2F../b", map[Semantics]want{RFC3986: {"/b", true}, Servlet: {"/a/b", true}}},
		{"dot dot after empty and dot", "/a//./../b", map[Semantics]want{RFC3986: {"/b", true}, Servlet: {"/a/b", true}}},
		{"dot dot after a name", "/a//b/../c", map[Semantics]want{RFC3986: {"/a/c", false}, Servlet: {"/a/c", false}}},
		{"repeated slashes", "//a///b", map[Semantics]want{RFC3986: {"/a/b", false}}},
		{"not origin form", "a/b", map[Semantics]want{RFC3986: {"/a/b", true}}},
		{"asterisk", "*", map[Semantics]want{RFC3986: {"/*", true}}},
		// Absolute-form targets are the caller's: the scheme and authority
		// are taken off before Normalize sees the path.
		{"absolute form is not a path", "http://h/a", map[Semantics]want{RFC3986: {"/http:/h/a", true}}},
		{"raw quote", `/a"b`, map[Semantics]want{RFC3986: {`/a"b`, true}}},
		{"raw space", "/a b", map[Semantics]want{RFC3986: {"/a b", true}}},
		{"raw non-ASCII", "/a\xc3\x84", map[Semantics]want{RFC3986: {"/aÄ", true}, CaseInsensitive: {"/aä", true}}},
		{"sub-delims", "/a!$&'()*+,=:@~_-.b", map[Semantics]want{RFC3986: {"/a!$&'()*+,=:@~_-.b", false}}},
	} {
		for s, w := range tc.want {
			t.Run(tc.name+"/"+s.String(), func(t *testing.T) {
				p, amb := Normalize(tc.raw, s)
				require.Equal(t, w.path, p, "Normalize(%q, %s)", tc.raw, s)
				require.Equal(t, w.amb, amb, "Normalize(%q, %s) ambiguous", tc.raw, s)
			})
		}
	}
}

// Paths longer than the stack buffer take the heap and come out the same.
func TestNormalizeLongPath(t *testing.T) {
	raw := strings.Repeat("/a;x/./b%2e/..", 500) + "/end"
	want := strings.Repeat("/a", 500) + "/end"
	got, amb := Normalize(raw, Servlet)
	require.Equal(t, want, got)
	require.True(t, amb)
	got, amb = Normalize(strings.Repeat("/Ab", 1000), CaseInsensitive)
	require.Equal(t, strings.Repeat("/ab", 1000), got)
	require.False(t, amb)
}

// The written model of the origins no test here can start. Each row is a
// fact about the vendor's behaviour and what Normalize makes of it.
var windowsModel = []struct {
	fact      string
	s         Semantics
	raw, want string
}{
	// IIS's static file handler looks names up upper-cased; NTFS compares
	// names through the volume's Unicode upcase table ($UpCase).
	{"IIS static files: case does not matter", iis, "/Images/LOGO.png", "/images/logo.png"},
	{"NTFS upcase table covers non-ASCII letters", CaseInsensitive, "/%C3%84PI", "/äpi"},
	{"simple upper-case mapping, not case folding: the Kelvin sign is its own upper case", CaseInsensitive, "/%E2%84%AA", "/\u212a"},
	// ASP.NET routing matches templates with ordinal case-insensitive
	// comparison (per-character invariant upper case).
	{"ASP.NET routing: /API and /api are one route", CaseInsensitive, "/API/Orders", "/api/orders"},
	// Win32 path normalisation: '/' and '\' are both separators.
	{"Win32: backslash separates", Windows, `/api\admin`, "/api/admin"},
	{"Win32: decoded backslash separates", Windows, "/api%5Cadmin", "/api/admin"},
	// Win32 path normalisation trims trailing periods and spaces from the
	// last segment, and a single trailing period from the others.
	{"Win32: trailing period dropped", Windows, "/admin.", "/admin"},
	{"Win32: trailing space dropped", Windows, "/admin%20", "/admin"},
	{"Win32: a single trailing period in a middle segment", Windows, "/api./x", "/api/x"},
	{"Win32: '.' and '..' resolve before trimming", Windows, `/a\b\..\c.`, "/a/c"},
	{"IIS with both", iis, `/API.\Admin%20`, "/api/admin"},
}

func TestWindowsAndCaseModel(t *testing.T) {
	for _, m := range windowsModel {
		t.Run(m.fact, func(t *testing.T) {
			p, _ := Normalize(m.raw, m.s)
			require.Equal(t, m.want, p, "Normalize(%q, %s)", m.raw, m.s)
		})
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Semantics
	}{
		{"rfc3986", RFC3986},
		{"servlet", Servlet},
		{"case-insensitive", CaseInsensitive},
		{"windows", Windows},
		{"servlet+case-insensitive", Servlet | CaseInsensitive},
		{"windows+case-insensitive+servlet", Servlet | CaseInsensitive | Windows},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Parse(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			again, err := Parse(got.String())
			require.NoError(t, err)
			require.Equal(t, got, again, "String() %q parses back", got.String())
		})
	}
	for _, bad := range []string{"", "Servlet", "tomcat", "servlet+", "+servlet", "servlet+servlet", "rfc3986+servlet", "servlet, windows", "case_insensitive"} {
		t.Run("bad/"+bad, func(t *testing.T) {
			_, err := Parse(bad)
			require.Error(t, err)
		})
	}
	_, err := Parse("tomcat")
	require.ErrorIs(t, err, ErrUnknown)
	require.Equal(t, "servlet+case-insensitive+windows", (Servlet | CaseInsensitive | Windows).String())
	require.Equal(t, "servlet+0x80", (Servlet | 0x80).String())
}

// A clean path costs no allocation, whatever the semantics.
func TestNormalizeCleanDoesNotAllocate(t *testing.T) {
	for _, s := range []Semantics{RFC3986, Servlet, CaseInsensitive, Windows, Servlet | CaseInsensitive | Windows} {
		for _, p := range []string{"/", "/api/v1/orders", "/api/v1/orders?id=7&x=/../", "/a-b_c~d.e/f!g:h@i"} {
			n := testing.AllocsPerRun(100, func() {
				if got, amb := Normalize(p, s); amb || !strings.HasPrefix(p, got) {
					t.Fatalf("Normalize(%q, %s) = %q, %v", p, s, got, amb)
				}
			})
			require.Zero(t, n, "allocations for %q, %s", p, s)
		}
	}
}

var allSemantics = []Semantics{RFC3986, Servlet, CaseInsensitive, Windows, Servlet | CaseInsensitive, Windows | CaseInsensitive, Servlet | CaseInsensitive | Windows}

// FuzzNormalize checks what Normalize promises for any input: no panic, a
// rooted path without empty, "." or ".." segments or trailing slash, the
// same answer when normalised again, and a path the clean fast path takes
// unchanged is not ambiguous.
func FuzzNormalize(f *testing.F) {
	for _, seed := range []string{"/public/..;/api/x", "/api;x/y", "/api%3bx/y", `/api\x`, "/api%5cx", "/api%u002fx", "/api%c0%afx", "/api./x", "/api%20/x", "/API/x", "/%C3%84PI", "/%E2%84%AA", "/a#b", "/a//../b", "%", "/%u", ";", "/\xff", "/%ud800"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		for _, s := range allSemantics {
			p, amb := Normalize(raw, s)
			if p == "" || p[0] != '/' || (len(p) > 1 && p[len(p)-1] == '/') {
				t.Fatalf("Normalize(%q, %s) = %q: not rooted or a trailing slash", raw, s, p)
			}
			for seg := range strings.SplitSeq(p[1:], "/") {
				if p != "/" && (seg == "" || seg == "." || seg == "..") {
					t.Fatalf("Normalize(%q, %s) = %q: segment %q", raw, s, p, seg)
				}
			}
			if s&Servlet != 0 && !utf8.ValidString(p) {
				t.Fatalf("Normalize(%q, %s) = %q: not UTF-8", raw, s, p)
			}
			if !amb && s&Windows != 0 && strings.ContainsRune(p, '\\') {
				t.Fatalf("Normalize(%q, %s) = %q: backslash left", raw, s, p)
			}
			if isClean(raw, s) && (p != raw || amb) {
				t.Fatalf("clean %q changed by Normalize(_, %s): %q, %v", raw, s, p, amb)
			}
			// Normalising the answer again changes nothing but what decoding
			// a second time changes ('%' in the answer).
			if !strings.ContainsAny(p, "%;\\?#") {
				if again, _ := Normalize(p, s); again != p {
					t.Fatalf("Normalize(%q, %s) = %q, normalised again %q", raw, s, p, again)
				}
			}
		}
	})
}

func BenchmarkNormalize(b *testing.B) {
	for _, s := range allSemantics {
		for _, in := range []struct{ name, raw string }{
			{"clean", "/api/v1/orders/12345"},
			{"dirty", "/api/v1/../v2/orders;jsessionid=9/%41BC/./x/"},
		} {
			b.Run(s.String()+"/"+in.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					Normalize(in.raw, s)
				}
			})
		}
	}
}

// AppendEscaped writes a normalised path so that it reads back as itself:
// nothing in it is a query, fragment, parameter, escape or separator the
// path did not have, and a clean path is written as it is.
func TestAppendEscapedReadsBack(t *testing.T) {
	for _, p := range []string{"/api/x", "/", "/a?b#c;d%e f", "/apiÀ¯x", "/a\\b", "/a\x00b", "/%41", "/a+b&c=d:@!$'()*,~"} {
		got := string(AppendEscaped(nil, p))
		require.NotContains(t, got[1:], "?")
		require.NotContains(t, got, "#")
		require.NotContains(t, got, ";")
		require.NotContains(t, got, " ")
		back, _ := Normalize(got, RFC3986) // "%2541" is a double escape, so ambiguous: the origin decodes once
		require.Equal(t, p, back, "%q escaped as %q", p, got)
	}
	require.Equal(t, "/api/x", string(AppendEscaped(nil, "/api/x")))
	require.Equal(t, "/a%3Fb%23c%3Bd%25e%20f", string(AppendEscaped(nil, "/a?b#c;d%e f")))
}

// queryStart finds the first '?' or '#' as strings.IndexAny does, whichever
// comes first and wherever the other is.
func TestQueryStart(t *testing.T) {
	for _, raw := range []string{"", "/", "/a/b", "?", "#", "/a?b", "/a#b", "/a?b#c", "/a#b?c", "?#", "#?", "/a??b", "/a##b", "/%3F?x", "/a;b#c?d#e"} {
		require.Equal(t, strings.IndexAny(raw, "?#"), queryStart(raw), "%q", raw)
	}
}
