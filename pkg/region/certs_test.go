package region

import (
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

func TestCertNames(t *testing.T) {
	for name, ok := range map[string]bool{
		"shop": true, "wildcard-example.com": true, "a_b": true,
		"": false, ".": false, "..": false, "a/b": false, "a b": false, string(make([]byte, 129)): false,
	} {
		require.Equal(t, ok, ValidCertName(name), "%q", name)
	}
	l := NewLayout("")
	prefix := l.Certs("eu-west")
	require.Equal(t, "edgeguard/certs/eu-west/", prefix)
	got := certsOf(api.KVPairs{
		{Key: prefix + "shop", Value: []byte("x"), ModifyIndex: 7},
		{Key: prefix + "nested/key", Value: []byte("y")}, // not a certificate key
		{Key: prefix, Value: nil},                        // the folder itself
	}, prefix)
	require.Equal(t, []StoredCert{{Name: "shop", PEM: []byte("x"), ModifyIndex: 7}}, got)
}
