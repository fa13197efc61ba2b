package region

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
)

// The edges of the canary PoP read the canary document as the region
// document while it exists, and the region's again once it is deleted;
// the edges of another PoP never see it. A second canary is refused.
func TestCanaryOnlyForItsPoP(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const r = "eu-west"
	l := rc.Layout()
	put := func(key, v string) {
		_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(v)}, nil)
		require.NoError(t, err)
	}
	put(l.GlobalRules(), "global")
	put(l.RegionRules(r), "current")

	watch := func(pop string) <-chan string {
		ch := make(chan string, 16)
		go rc.WatchPoPRules(ctx, r, pop, func(d Docs) { ch <- string(d.Region) }, func(error) {})
		return ch
	}
	next := func(ch <-chan string) string {
		select {
		case v := <-ch:
			return v
		case <-ctx.Done():
			t.Fatal("no rules delivered")
			return ""
		}
	}
	canaryPoP, otherPoP := watch("ams"), watch("fra")
	require.Equal(t, "current", next(canaryPoP))
	require.Equal(t, "current", next(otherPoP))

	require.NoError(t, rc.StartCanary(ctx, CanaryRules, r, "ams", []byte("candidate")))
	require.Equal(t, "candidate", next(canaryPoP))
	docs, err := rc.ReadPoPDocs(ctx, r, "ams")
	require.NoError(t, err)
	require.Equal(t, "candidate", string(docs.Region))
	docs, err = rc.ReadPoPDocs(ctx, r, "fra")
	require.NoError(t, err)
	require.Equal(t, "current", string(docs.Region))
	docs, err = rc.ReadDocs(ctx, r) // regionctl's view: the region document
	require.NoError(t, err)
	require.Equal(t, "current", string(docs.Region))

	// One canary per region: not at another PoP, nor again at this one.
	require.True(t, errors.Is(rc.StartCanary(ctx, CanaryRules, r, "fra", []byte("other")), ErrCanaryRunning))
	require.True(t, errors.Is(rc.StartCanary(ctx, CanaryRules, r, "ams", []byte("other")), ErrCanaryRunning))
	running, err := rc.Canaries(ctx, r)
	require.NoError(t, err)
	require.Len(t, running, 1)
	require.Equal(t, "ams", running[0].PoP)

	// A key that only starts like the PoP's (a nested name) is not it.
	put(l.RulesCanary(r, "ams")+"/x", "nested")
	put(l.RegionRules(r), "current2")
	require.Equal(t, "current2", next(otherPoP))
	require.NoError(t, rc.StopCanary(ctx, CanaryRules, r, "ams"))
	require.Equal(t, "current2", next(canaryPoP))
	select {
	case v := <-otherPoP:
		t.Fatalf("the other PoP was handed %q", v)
	default:
	}
}

// A shedder or host table canary is read by the edges of its PoP only, in
// place of the region's document of that kind, and flagged as a canary;
// deleting it returns the PoP to the region's document. While it runs, no
// canary of another kind may start in the region.
func TestShedderAndHostsCanaryOnlyForItsPoP(t *testing.T) {
	const r = "eu-west"
	type seen struct {
		doc    string
		canary bool
	}
	for _, kind := range []CanaryKind{CanaryShedder, CanaryHosts} {
		t.Run(string(kind), func(t *testing.T) {
			rc := testClient(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l := rc.Layout()
			key, watchPoP := l.Shedder(r), func(pop string, fn func([]byte, bool)) {
				rc.WatchPoPShedder(ctx, r, pop, fn, func(error) {})
			}
			if kind == CanaryHosts {
				key, watchPoP = l.Hosts(r), func(pop string, fn func([]byte, bool)) {
					rc.WatchPoPHosts(ctx, r, pop, func(d []byte, _ uint64, canary bool) { fn(d, canary) }, func(error) {})
				}
			}
			put := func(key, v string) {
				_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(v)}, nil)
				require.NoError(t, err)
			}
			put(key, "current")
			watch := func(pop string) <-chan seen {
				ch := make(chan seen, 16)
				go watchPoP(pop, func(d []byte, canary bool) { ch <- seen{string(d), canary} })
				return ch
			}
			next := func(ch <-chan seen) seen {
				select {
				case v := <-ch:
					return v
				case <-ctx.Done():
					t.Fatal("no document delivered")
					return seen{}
				}
			}
			canaryPoP, otherPoP := watch("ams"), watch("fra")
			require.Equal(t, seen{"current", false}, next(canaryPoP))
			require.Equal(t, seen{"current", false}, next(otherPoP))

			require.NoError(t, rc.StartCanary(ctx, kind, r, "ams", []byte("candidate")))
			require.Equal(t, l.Prefix+string(kind)+"/canary/eu-west/ams", l.Canary(kind, r, "ams"))
			require.Equal(t, seen{"candidate", true}, next(canaryPoP))

			// One canary per region, whatever its kind.
			require.ErrorIs(t, rc.StartCanary(ctx, CanaryRules, r, "fra", []byte("other")), ErrCanaryRunning)
			running, err := rc.Canaries(ctx, r)
			require.NoError(t, err)
			require.Len(t, running, 1)
			require.Equal(t, kind, running[0].Kind)
			require.Equal(t, "ams", running[0].PoP)

			// Another region's key that only starts like this one's is not it.
			put(key+"-2", "neighbour")
			put(key, "current2")
			require.Equal(t, seen{"current2", false}, next(otherPoP))
			require.NoError(t, rc.StopCanary(ctx, kind, r, "ams"))
			require.Equal(t, seen{"current2", false}, next(canaryPoP))
			select {
			case v := <-otherPoP:
				t.Fatalf("the other PoP was handed %+v", v)
			default:
			}
		})
	}
}

// A global canary is read by the edges of its PoP only, in place of
// rules/global and flagged as such, with the region document still
// beside it; regionctl's view (ReadDocs) never sees it. Its key cannot be
// a rules canary key of any region, and it counts as the region's one
// canary.
func TestGlobalCanaryOnlyForItsPoP(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const r = "eu-west"
	l := rc.Layout()
	put := func(key, v string) {
		_, err := rc.API().KV().Put(&api.KVPair{Key: key, Value: []byte(v)}, nil)
		require.NoError(t, err)
	}
	put(l.GlobalRules(), "global")
	put(l.RegionRules(r), "current")
	type seen struct {
		global, region string
		canary         bool
	}
	watch := func(pop string) <-chan seen {
		ch := make(chan seen, 16)
		go rc.WatchPoPRules(ctx, r, pop, func(d Docs) { ch <- seen{string(d.Global), string(d.Region), d.GlobalCanary} }, func(error) {})
		return ch
	}
	next := func(ch <-chan seen) seen {
		select {
		case v := <-ch:
			return v
		case <-ctx.Done():
			t.Fatal("no rules delivered")
			return seen{}
		}
	}
	canaryPoP, otherPoP := watch("ams"), watch("fra")
	require.Equal(t, seen{"global", "current", false}, next(canaryPoP))
	require.Equal(t, seen{"global", "current", false}, next(otherPoP))

	require.NoError(t, rc.StartCanary(ctx, CanaryGlobal, r, "ams", []byte("candidate")))
	require.Equal(t, l.Prefix+"rules/canary-global/eu-west/ams", l.GlobalCanary(r, "ams"))
	require.Equal(t, seen{"candidate", "current", true}, next(canaryPoP))
	docs, err := rc.ReadPoPDocs(ctx, r, "ams")
	require.NoError(t, err)
	require.Equal(t, "candidate", string(docs.Global))
	require.False(t, docs.Canary, "the region document is the region's")
	docs, err = rc.ReadDocs(ctx, r)
	require.NoError(t, err)
	require.Equal(t, "global", string(docs.Global))

	// One canary per region, whatever its kind; listed with its kind.
	require.ErrorIs(t, rc.StartCanary(ctx, CanaryRules, r, "fra", []byte("other")), ErrCanaryRunning)
	running, err := rc.Canaries(ctx, r)
	require.NoError(t, err)
	require.Len(t, running, 1)
	require.Equal(t, CanaryGlobal, running[0].Kind)
	require.Equal(t, "ams", running[0].PoP)

	// No region name makes a rules canary key a global canary key, nor
	// one kind's prefix the other's.
	for _, name := range []string{"global", "canary-global", "eu-west"} {
		for _, other := range []string{"global", "canary-global", "eu-west"} {
			g, rg := l.Canaries(CanaryGlobal, name), l.Canaries(CanaryRules, other)
			require.False(t, strings.HasPrefix(g, rg) || strings.HasPrefix(rg, g), "%s and %s", g, rg)
		}
	}

	put(l.GlobalRules(), "global2")
	require.Equal(t, seen{"global2", "current", false}, next(otherPoP))
	require.NoError(t, rc.StopCanary(ctx, CanaryGlobal, r, "ams"))
	require.Equal(t, seen{"global2", "current", false}, next(canaryPoP))
	select {
	case v := <-otherPoP:
		t.Fatalf("the other PoP was handed %+v", v)
	default:
	}
}
