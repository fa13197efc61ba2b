package edge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// Issue 42, item 6: the edge reads the documents it follows in Consul as
// regionctl does (pkg/strictjson): a key in another case, an unknown key
// or a key twice is refused (edgeguard_edge_rules_rejected_total) and the
// document in force stays, where encoding/json alone put the region in
// shadow ({"MODE":"shadow"}) or switched the shedder off ({"ENABLED":false}).
func TestConsulDocumentsReadStrictly(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	defer c.Close()
	rc := regionClient(t, c)
	layout := rc.Layout()
	push(t, rc, "eu-west", layout.GlobalRules(), tightGlobal)
	a := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), "")
	waitVersion(t, a, effectiveVersion(t, tightGlobal, ""), time.Now())

	write := func(key, doc string) {
		t.Helper()
		_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(doc)}, &api.WriteOptions{Datacenter: "eu-west"})
		require.NoError(t, err)
	}
	waitFor := func(what string, cond func() error) {
		t.Helper()
		require.NoError(t, proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, what, func(context.Context) error { return cond() }))
	}
	ratio := func() float64 { return metricValue(t, a, "edgeguard_edge_enforced_keys_ratio") }

	// Good documents first: what must stay.
	write(layout.Enforcement("eu-west"), `{"mode":"enforce","percent":50}`)
	write(layout.Shedder("eu-west"), `{"enabled":true,"good":0.6}`)
	waitFor("the good documents applied", func() error {
		if ratio() != 0.5 || a.shed.Config().Good != 0.6 {
			return fmt.Errorf("ratio %v, good %v", ratio(), a.shed.Config().Good)
		}
		return nil
	})

	for _, tc := range []struct{ name, key, doc string }{
		{"enforcement: a key in another case", layout.Enforcement("eu-west"), `{"MODE":"shadow"}`},
		{"enforcement: a key twice", layout.Enforcement("eu-west"), `{"mode":"enforce","mode":"shadow"}`},
		{"enforcement: an unknown key", layout.Enforcement("eu-west"), `{"mode":"shadow","why":"test"}`},
		{"enforcement: a percent off the steps", layout.Enforcement("eu-west"), `{"mode":"enforce","percent":0.001}`},
		{"shedder: a key in another case", layout.Shedder("eu-west"), `{"ENABLED":false}`},
		{"shedder: a key twice", layout.Shedder("eu-west"), `{"enabled":true,"enabled":false}`},
		{"shedder: an unknown key", layout.Shedder("eu-west"), `{"enabld":false}`},
		{"shedder: a nested key in another case", layout.Shedder("eu-west"), `{"tiers":{"Paths":[]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricValue(t, a, "edgeguard_edge_rules_rejected_total")
			write(tc.key, tc.doc)
			waitFor("the document refused", func() error {
				if n := metricValue(t, a, "edgeguard_edge_rules_rejected_total"); n != before+1 {
					return fmt.Errorf("rejected %v, was %v", n, before)
				}
				return nil
			})
			require.Equal(t, 0.5, ratio(), "the switch in force stays")
			require.True(t, a.shed.Config().Enabled, "the shedder stays on")
			require.Equal(t, 0.6, a.shed.Config().Good)
			require.Equal(t, 1.0, metricSum(t, a, "edgeguard_edge_enforcement_info", "mode", "enforce"))
		})
	}
}
