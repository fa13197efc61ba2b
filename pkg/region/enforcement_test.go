package region

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

func TestParseEnforcement(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      Enforcement
		err       string
	}{
		{"empty is enforce everything", "", Enforcement{ModeEnforce, 100}, ""},
		{"shadow", `{"mode":"shadow"}`, Enforcement{ModeShadow, 100}, ""},
		{"percentage", `{"mode":"enforce","percent":12.5}`, Enforcement{ModeEnforce, 12.5}, ""},
		{"no mode is enforce", `{"percent":0}`, Enforcement{ModeEnforce, 0}, ""},
		{"unknown key", `{"mode":"shadow","pct":3}`, Enforcement{}, `unknown field "pct"`},
		{"a key in another case", `{"MODE":"shadow"}`, Enforcement{}, `unknown field "MODE": names are case-sensitive, the field is "mode"`},
		{"a key twice", `{"mode":"enforce","mode":"shadow"}`, Enforcement{}, `field "mode" given twice`},
		{"a percent off the 0.01 steps", `{"mode":"enforce","percent":0.001}`, Enforcement{}, "percent: must be in steps of 0.01"},
		{"a percent on the steps, spelled in binary", `{"mode":"enforce","percent":33.33}`, Enforcement{ModeEnforce, 33.33}, ""},
		{"the smallest step", `{"mode":"enforce","percent":0.01}`, Enforcement{ModeEnforce, 0.01}, ""},
		{"bad mode and percent, both reported", `{"mode":"off","percent":101}`, Enforcement{}, "mode: must be"},
		{"percent with shadow", `{"mode":"shadow","percent":5}`, Enforcement{}, "only with mode enforce"},
		{"trailing data", `{"mode":"shadow"} {}`, Enforcement{}, "data after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnforcement([]byte(tc.doc))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			again, err := ParseEnforcement(got.Marshal())
			require.NoError(t, err)
			require.Equal(t, got, again, "Marshal round-trips")
		})
	}
	_, err := ParseEnforcement([]byte(`{"mode":"off","percent":101}`))
	require.ErrorContains(t, err, "percent: must be between 0 and 100")
}

func TestEnforcementThresholdAndBuckets(t *testing.T) {
	require.Equal(t, uint64(0), Enforcement{ModeShadow, 100}.Threshold())
	require.Equal(t, uint64(Buckets), DefaultEnforcement().Threshold())
	require.Equal(t, uint64(1250), Enforcement{ModeEnforce, 12.5}.Threshold())
	require.Equal(t, uint64(1), Enforcement{ModeEnforce, 0.01}.Threshold())

	// Bucket is FNV-1a (the same on every edge, whatever its build).
	for _, k := range []string{"", "per-ip|203.0.113.7", "k"} {
		h := fnv.New64a()
		_, _ = h.Write([]byte(k))
		require.Equal(t, h.Sum64()%Buckets, Bucket(k), k)
	}
	// Spread: 10 % of 20,000 keys is near 2,000.
	in := 0
	th := Enforcement{ModeEnforce, 10}.Threshold()
	for i := range 20000 {
		if Bucket(fmt.Sprintf("per-ip|10.%d.%d.1", i/256, i%256)) < th {
			in++
		}
	}
	require.InDelta(t, 2000, in, 300)
	require.NotEqual(t, Enforcement{ModeEnforce, 10}.Version(), Enforcement{ModeEnforce, 20}.Version())
}

// The watch delivers the switch at start (absent: nil) and every change,
// and ignores other regions' switches.
func TestWatchEnforcement(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.WatchEnforcement(ctx, "eu-west", func(v []byte) { got <- string(v) }, nil)
	}()
	next := func() string {
		select {
		case v := <-got:
			return v
		case <-time.After(10 * time.Second):
			t.Fatal("no value from the watch")
			return ""
		}
	}
	require.Equal(t, "", next())
	kv := rc.API().KV()
	_, err := kv.Put(&api.KVPair{Key: rc.Layout().Enforcement("eu-west-2"), Value: []byte(`{"mode":"shadow"}`)}, nil)
	require.NoError(t, err)
	_, err = kv.Put(&api.KVPair{Key: rc.Layout().Enforcement("eu-west"), Value: []byte(`{"mode":"enforce","percent":5}`)}, nil)
	require.NoError(t, err)
	require.Equal(t, `{"mode":"enforce","percent":5}`, next(), "eu-west-2's switch is not eu-west's")
	_, err = kv.Delete(rc.Layout().Enforcement("eu-west"), nil)
	require.NoError(t, err)
	require.Equal(t, "", next())
	cancel()
	<-done
}
