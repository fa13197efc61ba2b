package population

import (
	"math"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewIsDeterministicAndDistinct(t *testing.T) {
	o := Default()
	o.Size = 5000
	o.Seed = 7
	a, err := New(o)
	require.NoError(t, err)
	b, err := New(o)
	require.NoError(t, err)
	require.Equal(t, a.ids, b.ids, "same options, same identities")

	o.Seed = 8
	c, err := New(o)
	require.NoError(t, err)
	require.NotEqual(t, a.ids, c.ids, "another seed, another population")

	v4, v6, roaming := 0, 0, 0
	keys := map[string]bool{}
	prefixes := map[netip.Prefix]bool{}
	for _, id := range a.ids {
		require.False(t, keys[id.APIKey], "duplicate API key %s", id.APIKey)
		keys[id.APIKey] = true
		bits := 32
		if id.IPv6 {
			v6++
			bits = 64
			require.True(t, id.Addr.Is6())
			require.True(t, netip.MustParsePrefix("2001:db8::/32").Contains(id.Addr))
		} else {
			v4++
			require.True(t, id.Addr.Is4())
			require.True(t, netip.MustParsePrefix("10.0.0.0/8").Contains(id.Addr))
		}
		pfx := netip.PrefixFrom(id.Addr, bits).Masked()
		require.False(t, prefixes[pfx], "two identities share %s", pfx)
		prefixes[pfx] = true
		if id.Roaming {
			roaming++
		}
	}
	// 25% IPv6 and 10% roaming of 5000, with a wide margin for the draw.
	require.InDelta(t, 1250, v6, 200)
	require.InDelta(t, 500, roaming, 120)
	require.Equal(t, 5000, v4+v6)
}

func TestPickerAddrStaysInTheClientsSlash64(t *testing.T) {
	o := Default()
	o.IPv6Share = 1
	p, err := New(o)
	require.NoError(t, err)
	pk := p.Picker(1)
	id := p.ids[3]
	seen := map[netip.Addr]bool{}
	for range 50 {
		a := pk.Addr(id)
		require.Equal(t, netip.PrefixFrom(id.Addr, 64).Masked(), netip.PrefixFrom(a, 64).Masked())
		seen[a] = true
	}
	require.Greater(t, len(seen), 45, "the interface identifier must vary")

	o.IPv6Share = 0
	p4, err := New(o)
	require.NoError(t, err)
	require.Equal(t, p4.ids[3].Addr, p4.Picker(1).Addr(p4.ids[3]))
}

func TestPickerDistributions(t *testing.T) {
	const draws = 200000
	counts := func(o Options, stream uint64) []int {
		p, err := New(o)
		require.NoError(t, err)
		pk := p.Picker(stream)
		c := make([]int, o.Size)
		for range draws {
			c[pk.Pick().ID]++
		}
		return c
	}
	t.Run("uniform", func(t *testing.T) {
		o := Default()
		o.Size = 100
		c := counts(o, 1)
		for i, n := range c {
			require.InDelta(t, draws/100, n, 400, "identity %d", i) // expected 2000, sd ~44
		}
		require.Equal(t, c, counts(o, 1), "same stream, same sequence")
		require.NotEqual(t, c, counts(o, 2), "another stream, another sequence")
	})
	t.Run("zipf", func(t *testing.T) {
		o := Default()
		o.Size = 100
		o.Distribution = Zipf
		o.ZipfS = 1.5
		c := counts(o, 1)
		// P(k) ∝ (1+k)^-1.5: identity 0 is 2^1.5 ≈ 2.83 times as popular as identity 1.
		ratio := float64(c[0]) / float64(c[1])
		require.InDelta(t, math.Pow(2, 1.5), ratio, 0.2)
		require.Greater(t, c[1], c[50]*10)
	})
}

func TestValidate(t *testing.T) {
	bad := Options{Size: 0, IPv6Share: 2, RoamingShare: -1, Distribution: "pareto"}
	err := bad.Validate()
	require.Error(t, err)
	for _, want := range []string{"size 0", "ipv6Share 2", "roamingShare -1", `distribution "pareto"`} {
		require.ErrorContains(t, err, want)
	}
	z := Default()
	z.Distribution = Zipf
	z.ZipfS = 1
	require.ErrorContains(t, z.Validate(), "zipfS 1")
	_, err = New(bad)
	require.ErrorContains(t, err, "population options")
	_, err = (&Population{ids: make([]Identity, 2)}).Get(2)
	require.ErrorContains(t, err, "identity 2")
}
