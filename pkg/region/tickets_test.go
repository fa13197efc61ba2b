package region

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTicketKeysRotateAndParse(t *testing.T) {
	var keys TicketKeys
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	var history [][32]byte
	for i := range 5 {
		keys = keys.Rotate(at.Add(time.Duration(i) * time.Hour))
		history = append([][32]byte{keys.Keys[0]}, history...)
		require.Len(t, keys.Keys, min(i+1, TicketKeysKept))
		require.Equal(t, history[:len(keys.Keys)], keys.Keys, "the new key first, then the newest previous ones")
	}
	data, err := json.Marshal(keys)
	require.NoError(t, err)
	back, err := ParseTicketKeys(data)
	require.NoError(t, err)
	require.Equal(t, keys.Keys, back.Keys)
	require.True(t, keys.Rotated.Equal(back.Rotated))

	for name, doc := range map[string]string{
		"no key":                  `{"keys": [], "rotated": "2026-01-02T03:04:05Z"}`,
		"short key":               `{"keys": ["00ff"], "rotated": "2026-01-02T03:04:05Z"}`,
		"not hex":                 `{"keys": ["zz00000000000000000000000000000000000000000000000000000000000000"]}`,
		"unknown field":           `{"keys": ["0000000000000000000000000000000000000000000000000000000000000000"], "x": 1}`,
		"not JSON":                `keys`,
		"a field in another case": `{"Keys": ["0000000000000000000000000000000000000000000000000000000000000000"]}`,
		"a field twice":           `{"keys": ["0000000000000000000000000000000000000000000000000000000000000000"], "keys": ["0000000000000000000000000000000000000000000000000000000000000000"]}`,
	} {
		_, err := ParseTicketKeys([]byte(doc))
		require.Error(t, err, name)
	}
}
