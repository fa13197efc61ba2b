package rules

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNormalizePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "/"},
		{"/", "/"},
		{"*", "/*"},
		{"admin", "/admin"},
		{"/admin", "/admin"},
		{"/admin/", "/admin"},
		{"//admin", "/admin"},
		{"///admin//x///", "/admin/x"},
		{"/%2Fadmin", "/admin"},
		{"/%2fadmin", "/admin"},
		{"/%61dmin", "/admin"},
		{"/a/../admin", "/admin"},
		{"/./admin", "/admin"},
		{"/../../admin", "/admin"},
		{"/admin%2F..%2Fsecret", "/secret"},
		{"/admin/%2E%2E/secret", "/secret"},
		{"/admin/%2e./secret", "/secret"},
		{"/a/b/c/../../d", "/a/d"},
		{"/a/./b/.", "/a/b"},
		{"/a/..", "/"},
		{"/..", "/"},
		{"..", "/"},
		{"/...", "/..."},
		{"/a..b/.c", "/a..b/.c"},
		{"/admin?x=1", "/admin"},
		{"/admin?x=/../../y", "/admin"},
		{"/admin#frag", "/admin"},
		{"?only=query", "/"},
		{"/a%3Fb", "/a?b"},
		{"/Admin/CASE", "/Admin/CASE"},
		{"/bad%zzescape", "/bad%zzescape"},
		{"/trailing%", "/trailing%"},
		{"/trailing%4", "/trailing%4"},
		{"/%252F", "/%2F"},
		{"/a%00b", "/a\x00b"},
		{"/caf%C3%A9", "/café"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			require.Equal(t, tc.want, NormalizePath(tc.in))
		})
	}
}

func TestNormalizePathLong(t *testing.T) {
	// Longer than the stack buffer, so the heap fallback is exercised.
	long := "/" + strings.Repeat("seg/", 200) + "../x"
	require.Equal(t, "/"+strings.Repeat("seg/", 199)+"x", NormalizePath(long))
}

func TestNormalizePathCleanDoesNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() { _ = NormalizePath("/api/v1/users/42") })
	require.Zero(t, allocs)
}
