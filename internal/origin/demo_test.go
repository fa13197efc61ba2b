package origin

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// The demo origin echoes what it received as JSON, and stop ends it: its
// port refuses afterwards (and TestMain finds no goroutine left).
func TestDemoEchoesTheRequest(t *testing.T) {
	addr, stop, err := StartDemo()
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPut, "http://"+addr+"/a/b?q=1", nil)
	require.NoError(t, err)
	req.Header.Set("X-Forwarded-For", "192.0.2.7")
	req.Header.Set("X-Request-ID", "r-1")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var got map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	require.Equal(t, map[string]string{
		"origin":          "edgeguard demo origin",
		"method":          "PUT",
		"path":            "/a/b",
		"x-forwarded-for": "192.0.2.7",
		"x-request-id":    "r-1",
	}, got)

	stop()
	_, err = client.Get("http://" + addr + "/")
	require.Error(t, err, "stopped")
}
