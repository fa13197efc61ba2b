package origin

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // every substring must appear; nil means valid
	}{
		{name: "defaults with one origin", mutate: func(*Config) {}},
		{name: "zero values mean defaults", mutate: func(c *Config) { *c = Config{URLs: c.URLs} }},
		{name: "https and trailing slash", mutate: func(c *Config) { c.URLs = []string{"https://origin.internal/", "http://[::1]:8080"} }},
		{name: "no origins", mutate: func(c *Config) { c.URLs = nil }, wantErr: []string{"urls: at least one"}},
		{
			name: "bad urls",
			mutate: func(c *Config) {
				c.URLs = []string{"ftp://x", "http://", "http://x/api", "http://x?q=1", "http://u:p@x", "::"}
			},
			wantErr: []string{
				"urls[0]", "scheme must be http or https",
				"urls[1]", "host is required",
				"urls[2]", "path must be empty",
				"urls[3]", "query and fragment",
				"urls[4]", "credentials",
				"urls[5]", "parsing",
			},
		},
		{
			name:    "duplicate origin",
			mutate:  func(c *Config) { c.URLs = []string{"http://a:1", "http://A:1"} },
			wantErr: []string{"urls[1]: duplicates urls[0]"},
		},
		{
			name: "every negative number reported at once",
			mutate: func(c *Config) {
				c.DialTimeout = -1
				c.HeaderTimeout = -time.Second
				c.ReadIdleTimeout = -time.Second
				c.Timeout = -time.Second
				c.MaxConnsPerHost = -1
				c.HealthCheckInterval = -1
				c.HealthCheckPath = "healthz"
				c.UnhealthyAfter = -1
			},
			wantErr: []string{
				"dial_timeout", "header_timeout", "read_idle_timeout", "timeout", "max_conns_per_host",
				"health_check_interval", "health_check_path", "unhealthy_after",
			},
		},
		{
			name: "pool and tls problems reported at once",
			mutate: func(c *Config) {
				c.Pool = "shop eu"
				c.TLS = TLSConfig{ServerName: "origin.internal:443", CAPEM: []byte("not pem")}
			},
			wantErr: []string{"pool", "tls.server_name", "tls.ca_pem"},
		},
		{name: "tls settings", mutate: func(c *Config) { c.Pool, c.TLS.ServerName = "shop-eu", "origin.internal" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.URLs = []string{"http://127.0.0.1:8081"}
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			for _, want := range tc.wantErr {
				require.Contains(t, err.Error(), want)
			}
			// One line per problem, so an operator sees them all.
			var joined interface{ Unwrap() []error }
			require.True(t, errors.As(err, &joined))
			require.Len(t, joined.Unwrap(), strings.Count(err.Error(), "\n")+1)
		})
	}
}

func TestWithDefaults(t *testing.T) {
	got := Config{URLs: []string{"http://a"}}.withDefaults()
	want := DefaultConfig()
	want.URLs = []string{"http://a"}
	want.HealthCheckInterval = 0 // zero is "off", not "default"
	require.Equal(t, want, got)
}
