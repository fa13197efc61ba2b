package region

import (
	"context"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

// An edge registers its release and the schemas it reads; Edges reads them
// back. A 0.1.0 edge (no such meta) and one with garbage meta read schema 1.
func TestRegistrationCarriesVersionAndSchemas(t *testing.T) {
	rc := testClient(t)
	ctx := context.Background()
	require.NoError(t, rc.Register(ctx, Registration{ID: "edge-new", Region: "eu-west", PoP: "ams", Port: 8080,
		RulesVersion: "abc", ShedderVersion: "def", HostsVersion: "ghi", Version: "v0.2.0", CheckURL: "http://127.0.0.1:1/readyz"}))
	for id, meta := range map[string]map[string]string{
		"edge-old":     {"region": "eu-west", "pop": "fra", "rules_version": "abc"},
		"edge-garbage": {"region": "eu-west", "pop": "fra", "schema_rules": "two", "schema_hosts": "-3", "schema_rls": "99999999999999999999"},
	} {
		require.NoError(t, rc.API().Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: Service, Port: 8080, Meta: meta}))
	}
	edges, _, err := rc.Edges(ctx, "eu-west", 0, 0)
	require.NoError(t, err)
	byID := map[string]Edge{}
	for _, e := range edges {
		byID[e.ID] = e
	}
	require.Len(t, byID, 3)
	require.Equal(t, "v0.2.0", byID["edge-new"].Version)
	require.Equal(t, DocumentSchemas.Reads(), byID["edge-new"].Schemas)
	for kind := range DocumentSchemas {
		require.Equal(t, DocumentSchemas.Reads()[kind], byID["edge-new"].Reads(kind), kind)
		require.Equal(t, 1, byID["edge-old"].Reads(kind), kind)
		require.Equal(t, 1, byID["edge-garbage"].Reads(kind), kind)
	}
	require.Equal(t, "", byID["edge-old"].Version)
	require.Equal(t, "def", byID["edge-new"].ShedderVersion)
	require.Equal(t, "", byID["edge-old"].ShedderVersion)
	require.Equal(t, "ghi", byID["edge-new"].HostsVersion)
}
