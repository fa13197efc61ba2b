package rules

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNormalizeHost(t *testing.T) {
	tests := []struct{ in, want string }{
		{"api.example.com", "api.example.com"},
		{"API.Example.COM", "api.example.com"},
		{"api.example.com:8443", "api.example.com"},
		{"api.example.com.", "api.example.com"},
		{"api.example.com.:443", "api.example.com"},
		{"[2001:DB8::1]:443", "2001:db8::1"},
		{"[::1]", "::1"},
		{"10.0.0.1:80", "10.0.0.1"},
		{"2001:db8::1", "2001:db8::1"},
		{"", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			require.Equal(t, tc.want, NormalizeHost(tc.in))
		})
	}
}
