package shedder

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func weighted(tracked int, weights HostWeights) HostShareConfig {
	c := hostCfg(tracked)
	c.DefaultWeight = 1
	c.Weights = weights
	return c
}

// contend measures the shares of hosts with every worker busy: each host
// takes one critical request (active), a host of the default weight takes
// critical requests until every one of capacity workers is held, then
// each host takes what its share allows. It returns what each holds.
func contend(h *HostShares, now time.Time, capacity int, hosts ...string) map[string]int {
	held := map[string]int{}
	for _, host := range hosts {
		held[host] += len(take(h, now, host, TierCritical, 1))
	}
	take(h, now, "filler.example", TierCritical, capacity-len(hosts))
	for _, host := range hosts {
		held[host] += len(take(h, now, host, TierRead, 100))
	}
	return held
}

func TestHostSharesWeights(t *testing.T) {
	now := time.Unix(1000, 0)
	t.Run("twice the weight, twice the share", func(t *testing.T) {
		// Weights 2, 1 and the filler's 1 of 16 workers: shares 8, 4, 4.
		h := NewHostShares(16, weighted(8, HostWeights{"A.Example.": 2}))
		require.Equal(t, map[string]int{"a.example": 8, "b.example": 4}, contend(h, now, 16, "a.example", "b.example"))
		_, active, share := h.Top()
		require.Equal(t, 3, active)
		require.Equal(t, 4, share, "the share of a host of the default weight")
	})
	t.Run("unweighted", func(t *testing.T) {
		h := NewHostShares(16, weighted(8, nil))
		require.Equal(t, map[string]int{"a.example": 6, "b.example": 6}, contend(h, now, 16, "a.example", "b.example"))
	})
	t.Run("wildcard, exact over wildcard, longest wildcard", func(t *testing.T) {
		// Weights 3 (x.big.example, by *.big.example), 1 (big.example: a
		// wildcard does not name its own suffix), 2 (the exact name over
		// the wildcard), 6 (the longer wildcard) and the filler's 1: 13 in
		// all, of 26 workers.
		h := NewHostShares(26, weighted(8, HostWeights{"*.big.example": 3, "y.big.example": 2, "*.z.big.example": 6}))
		got := contend(h, now, 26, "x.big.example", "big.example", "y.big.example", "a.z.big.example")
		require.Equal(t, map[string]int{"x.big.example": 6, "big.example": 2, "y.big.example": 4, "a.z.big.example": 12}, got)
	})
	t.Run("a host table's wildcard entry", func(t *testing.T) {
		// The edge names every host under a wildcard its host table lists
		// by the pattern (one share for all of them: hostroute's Route),
		// which weighs what the weights give the pattern, the longer
		// wildcard over the shorter: 3 and 6, and the filler's 1, of 20.
		h := NewHostShares(20, weighted(8, HostWeights{"*.big.example": 3, "*.z.big.example": 6}))
		got := contend(h, now, 20, "*.big.example", "*.z.big.example")
		require.Equal(t, map[string]int{"*.big.example": 6, "*.z.big.example": 12}, got)
	})
	t.Run("default weight", func(t *testing.T) {
		// A named host lighter than the rest: c.example 1, the others
		// (d.example and the filler) 3.
		cfg := weighted(8, HostWeights{"c.example": 1})
		cfg.DefaultWeight = 3
		h := NewHostShares(14, cfg)
		require.Equal(t, map[string]int{"c.example": 2, "d.example": 6}, contend(h, now, 14, "c.example", "d.example"))
	})
	t.Run("the pooled rest weighs the default", func(t *testing.T) {
		// One tracked slot, a.example's: b.example (weight 3) lands in the
		// pool, which weighs 1 whatever its hosts are named.
		h := NewHostShares(12, weighted(1, HostWeights{"b.example": 3}))
		take(h, now, "a.example", TierCritical, 12)
		require.Len(t, take(h, now, "b.example", TierRead, 100), 6)
		_, active, _ := h.Top()
		require.Equal(t, 2, active, "the pool counts once, however many of its requests arrived")
	})
}

// A weighted host alone may use every worker, as any lone host may; it is
// held to its weighted share only once another host is active.
func TestHostSharesWeightedHostAlone(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, w := range []int{1, 4, MaxHostWeight} {
		h := NewHostShares(12, weighted(8, HostWeights{"a.example": w}))
		require.Len(t, take(h, now, "a.example", TierRead, 20), 20, "weight %d", w)
	}
	// A light host alone, too.
	cfg := weighted(8, HostWeights{"a.example": 1})
	cfg.DefaultWeight = MaxHostWeight
	h := NewHostShares(12, cfg)
	require.Len(t, take(h, now, "a.example", TierRead, 20), 20)
}

// Weights set by an update apply to the hosts already active, at their
// next request.
func TestHostWeightsLiveUpdate(t *testing.T) {
	s, err := New(DefaultConfig(), nil)
	require.NoError(t, err)
	s.AttachWorkers(NewWorkers(12, 0, 0))
	now := time.Unix(1000, 0)
	a := take(s.hosts, now, "a.example", TierRead, 1)
	b := take(s.hosts, now, "b.example", TierRead, 6)
	a = append(a, take(s.hosts, now, "a.example", TierRead, 10)...)
	require.Len(t, a, 6, "shares of 6")
	_, _, share := s.hosts.Top()
	require.Equal(t, 6, share)

	cfg := s.Config()
	cfg.HostShare.Weights = HostWeights{"a.example": 3}
	require.NoError(t, s.Update(cfg))
	// Shares 9 and 3: a takes 3 more, b (holding 6) none.
	require.Len(t, take(s.hosts, now, "a.example", TierRead, 10), 3)
	require.Empty(t, take(s.hosts, now, "b.example", TierRead, 10))
	_, _, share = s.hosts.Top()
	require.Equal(t, 3, share)
	for _, l := range b {
		l.Release()
	}
	require.Len(t, take(s.hosts, now, "b.example", TierRead, 10), 3)

	// A refused update keeps the weights in force.
	bad := s.Config()
	bad.HostShare.Weights = HostWeights{"a.example": 0}
	require.ErrorContains(t, s.Update(bad), `host_share.weights["a.example"]: must be in [1, 100], got 0`)
	require.Equal(t, HostWeights{"a.example": 3}, s.Config().HostShare.Weights)
	require.Empty(t, take(s.hosts, now, "a.example", TierRead, 10), "a holds its share of 9")
}

func TestHostWeightsValidation(t *testing.T) {
	many := make([]string, MaxHostWeights+1)
	for i := range many {
		many[i] = fmt.Sprintf(`"h%d.example": 1`, i)
	}
	cases := []struct {
		name, doc string
		want      []string // "" : valid
	}{
		{"valid", `{"weights": {"a.example": 2, "*.big.example": 4, "10.0.0.1": 1, "[2001:DB8::1]": 3}, "default_weight": 2}`, nil},
		{"at the bounds", `{"weights": {"a.example": 100, "b.example": 1}, "default_weight": 100}`, nil},
		{"zero weight", `{"weights": {"a.example": 0}}`, []string{`host_share.weights["a.example"]: must be in [1, 100], got 0`}},
		{"negative weight", `{"weights": {"a.example": -2}}`, []string{`host_share.weights["a.example"]: must be in [1, 100], got -2`}},
		{"huge weight", `{"weights": {"a.example": 1000000}}`, []string{`must be in [1, 100], got 1000000`}},
		{"weight past int64", `{"weights": {"a.example": 1e30}}`, []string{`cannot unmarshal`}},
		{"fractional weight", `{"weights": {"a.example": 1.5}}`, []string{`cannot unmarshal`}},
		{"weight as a string", `{"weights": {"a.example": "2"}}`, []string{`cannot unmarshal`}},
		{"weights not an object", `{"weights": ["a.example"]}`, []string{`cannot unmarshal`}},
		{"default weight zero", `{"default_weight": 0}`, []string{`host_share.default_weight: must be in [1, 100], got 0`}},
		{"default weight huge", `{"default_weight": 101}`, []string{`host_share.default_weight: must be in [1, 100], got 101`}},
		{"a port", `{"weights": {"a.example:8080": 2}}`, []string{`host_share.weights["a.example:8080"]: not a host pattern`}},
		{"a scheme", `{"weights": {"https://a.example": 2}}`, []string{`not a host pattern`}},
		{"a bare wildcard", `{"weights": {"*": 2}}`, []string{`host_share.weights["*"]: not a host pattern`}},
		{"a wildcard inside", `{"weights": {"a.*.example": 2}}`, []string{`a wildcard is only allowed as a leading`}},
		{"a wildcard on an address", `{"weights": {"*.10.0.0.1": 2}}`, []string{`a wildcard cannot apply to an IP address`}},
		{"empty", `{"weights": {"": 2}}`, []string{`empty host name`}},
		{"an empty label", `{"weights": {"a..example": 2}}`, []string{`labels must be 1-63 characters`}},
		{"not ASCII", `{"weights": {"é.example": 2}}`, []string{`invalid character`}},
		{"a control character", `{"weights": {"a\u0000.example": 2}}`, []string{`invalid character`}},
		{"two spellings of one host", `{"weights": {"A.example": 2, "a.example.": 3}}`, []string{`host_share.weights["a.example."]: names the same host as "A.example" (both are "a.example")`}},
		{"two spellings of one address", `{"weights": {"[2001:db8::1]": 2, "2001:DB8:0::1": 3}}`, []string{`names the same host`}},
		{"one key twice", `{"weights": {"a.example": 2, "a.example": 3}}`, []string{`key "a.example" given twice`}},
		{"too many", `{"weights": {` + strings.Join(many, ",") + `}}`, []string{`host_share.weights: at most 256 entries, got 257`}},
		{"every problem at once", `{"weights": {"a.example": 0, "b:1": 2}, "default_weight": -1}`,
			[]string{`host_share.default_weight`, `host_share.weights["a.example"]`, `host_share.weights["b:1"]`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(`{"host_share": ` + c.doc + `}`))
			if c.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestHostWeightsSettings(t *testing.T) {
	got, err := ApplySettings(DefaultConfig(), map[string]string{
		"host_share.weights": " a.example:2, *.big.example : 4,2001:db8::1:3", "host_share.default_weight": "2",
	})
	require.NoError(t, err)
	require.Equal(t, HostWeights{"a.example": 2, "*.big.example": 4, "2001:db8::1": 3}, got.HostShare.Weights)
	require.Equal(t, 2, got.HostShare.DefaultWeight)
	require.Equal(t, "*.big.example:4,2001:db8::1:3,a.example:2", got.HostShare.FormatWeights())
	// What show prints, set reads back.
	again, err := ApplySettings(DefaultConfig(), map[string]string{"host_share.weights": got.HostShare.FormatWeights(), "host_share.default_weight": "2"})
	require.NoError(t, err)
	require.Equal(t, got, again)
	// An empty value clears the weights, and the input is not modified.
	cleared, err := ApplySettings(got, map[string]string{"host_share.weights": ""})
	require.NoError(t, err)
	require.Nil(t, cleared.HostShare.Weights)
	require.Len(t, got.HostShare.Weights, 3)

	for _, c := range []struct{ val, want string }{
		{"a.example", `entry "a.example": want host:weight`},
		{"a.example:two", `entry "a.example:two": weight`},
		{"a.example:2,a.example:3", `a.example given twice`},
		{"a.example:0", `host_share.weights["a.example"]: must be in [1, 100]`},
		{"a.example:8080:2", `not a host pattern`},
		{strings.Repeat("h.example:1,", MaxHostWeights+1), `at most 256 entries`},
	} {
		_, err := ApplySettings(DefaultConfig(), map[string]string{"host_share.weights": c.val})
		require.ErrorIs(t, err, ErrInvalidConfig, c.val)
		require.ErrorContains(t, err, c.want, c.val)
	}
	_, err = ApplySettings(DefaultConfig(), map[string]string{"host_share.default_weight": "0"})
	require.ErrorContains(t, err, "host_share.default_weight: must be in [1, 100]")
}

// A document that weights nothing is written as before weights existed;
// one that does reads back the same.
func TestHostWeightsRoundTrip(t *testing.T) {
	data, err := DefaultConfig().MarshalJSON()
	require.NoError(t, err)
	require.NotContains(t, string(data), "weight")
	cfg := DefaultConfig()
	cfg.HostShare.Weights = HostWeights{"a.example": 2}
	cfg.HostShare.DefaultWeight = 3
	data, err = cfg.MarshalJSON()
	require.NoError(t, err)
	back, err := ParseConfig(data)
	require.NoError(t, err)
	require.Equal(t, cfg, back)
	// A document's weights replace those of the config it overlays.
	require.NoError(t, back.UnmarshalJSON([]byte(`{"host_share": {"weights": {"b.example": 4}}}`)))
	require.Equal(t, HostWeights{"b.example": 4}, back.HostShare.Weights)
	require.Equal(t, HostWeights{"a.example": 2}, cfg.HostShare.Weights)
}
