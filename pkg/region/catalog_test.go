package region

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCatalog(t *testing.T) {
	c, err := ParseCatalog([]byte(`{"regions":[{"name":"eu-west","redis":"redis://10.0.0.1:6379"},{"name":"us-east","redis":"redis://10.1.0.1:6379","redis_mode":"cluster"}]}`))
	require.NoError(t, err)
	require.Equal(t, []string{"eu-west", "us-east"}, c.Names())
	c, err = ParseCatalog([]byte(`{"regions":[{"name":"eu-west","redis":"redis://10.0.0.1:6379","redis_mode":"cluster","dial":{"10.0.0.1:6379":"192.0.2.1:16379"}}]}`))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"10.0.0.1:6379": "192.0.2.1:16379"}, c.Regions[0].Dial)

	for name, c := range map[string]struct{ doc, want string }{
		"unknown field":           {`{"regions":[{"name":"a","redis":"redis://x","weight":2}]}`, `unknown field "weight"`},
		"no regions":              {`{"regions":[]}`, "no regions"},
		"a field in another case": {`{"regions":[{"name":"a","Redis":"redis://x"}]}`, `regions[0]: unknown field "Redis": names are case-sensitive, the field is "redis"`},
		"a field twice":           {`{"regions":[{"name":"a","redis":"redis://x","redis":"redis://y"}]}`, `field "redis" given twice`},
		"a dial address twice":    {`{"regions":[{"name":"a","redis":"redis://x","dial":{"10.0.0.1:6379":"192.0.2.1:1","10.0.0.1:6379":"192.0.2.2:1"}}]}`, `regions[0].dial: key "10.0.0.1:6379" given twice`},
		"duplicate":               {`{"regions":[{"name":"a","redis":"redis://x"},{"name":"a","redis":"redis://y"}]}`, `duplicate name "a"`},
		"no redis":                {`{"regions":[{"name":"a"}]}`, "redis required"},
		"no name":                 {`{"regions":[{"redis":"redis://x"}]}`, "name required"},
		"bad mode":                {`{"regions":[{"name":"a","redis":"redis://x","redis_mode":"ring"}]}`, `unknown redis_mode "ring"`},
		"bad dial":                {`{"regions":[{"name":"a","redis":"redis://x","dial":{"10.0.0.1:6379":"nat-host"}}]}`, `"nat-host" is not host:port`},
	} {
		_, err := ParseCatalog([]byte(c.doc))
		require.ErrorContains(t, err, c.want, name)
	}
	// Every problem at once.
	_, err = ParseCatalog([]byte(`{"regions":[{"name":""},{"name":"b","redis_mode":"x"}]}`))
	require.ErrorContains(t, err, "name required")
	require.ErrorContains(t, err, "regions[1] (b): redis required")
	require.ErrorContains(t, err, `unknown redis_mode "x"`)
}
