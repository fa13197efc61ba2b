package region

import (
	"errors"
	"net/http"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

// An agent's 500 that says it could not reach a region's servers is
// ErrUnreachable for that region (regionctl's exit 7); any other 500 is a
// plain error.
func TestClassifyInForwardFailures(t *testing.T) {
	for _, body := range []string{
		"Remote DC has no server currently reachable",
		"No path to datacenter",
		"rpc error getting client: failed to get conn: dial tcp 127.0.0.1:8300: connect: connection refused",
		"No cluster leader",
	} {
		err := classifyIn("eu-west", "reading rules of eu-west", api.StatusError{Code: http.StatusInternalServerError, Body: body})
		var ru *RegionUnreachableError
		require.ErrorAs(t, err, &ru, body)
		require.Equal(t, "eu-west", ru.Region)
		require.ErrorIs(t, err, ErrUnreachable, body)
	}
	err := classifyIn("eu-west", "reading rules of eu-west", api.StatusError{Code: http.StatusInternalServerError, Body: "invalid key"})
	require.False(t, errors.Is(err, ErrUnreachable), "a 500 that is not a forwarding failure: %v", err)
}
