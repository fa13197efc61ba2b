package mixedversion

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// counter sends one client's requests, one at a time, and keeps what each
// rule's path answered, in order.
type counter struct {
	t      *testing.T
	c      *http.Client
	ip     string
	answer map[string][]int       // path → status codes in order
	by     map[string]map[int]int // path → edge version → 200s it gave
}

// newCounter is a client at ip counting the fleet's answers. The rules
// count in fixed windows of an hour, and every request a test counts must
// fall in one (a window starting again mid-test would admit the exact
// rule's limit twice): with less than a minute of the hour left, it waits
// for the next hour first.
func newCounter(t *testing.T, ip string) *counter {
	testenv.EarlyInWindow(time.Hour, time.Minute)
	tr := &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &counter{t: t, c: &http.Client{Transport: tr, Timeout: 15 * time.Second}, ip: ip,
		answer: map[string][]int{}, by: map[string]map[int]int{}}
}

// get sends GET path to e; anything but 200 or 429 fails the test.
func (k *counter) get(e *edge, path string) {
	k.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+e.Addr+path, nil)
	require.NoError(k.t, err)
	req.Header.Set("X-Forwarded-For", k.ip)
	resp, err := k.c.Do(req)
	require.NoError(k.t, err, "edge %s", e.name)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(k.t, err)
	require.Contains(k.t, []int{http.StatusOK, http.StatusTooManyRequests}, resp.StatusCode, "edge %s %s: %s", e.name, path, body)
	k.answer[path] = append(k.answer[path], resp.StatusCode)
	if resp.StatusCode == http.StatusOK {
		if k.by[path] == nil {
			k.by[path] = map[int]int{}
		}
		k.by[path][e.version]++
	}
}

// admitted is how many requests to path were admitted.
func (k *counter) admitted(path string) int {
	n := 0
	for _, code := range k.answer[path] {
		if code == http.StatusOK {
			n++
		}
	}
	return n
}

// requireExact checks that the exact rule admitted the first exactLimit
// requests and denied every one after them: one count across the fleet,
// never reset.
func (k *counter) requireExact() {
	k.t.Helper()
	codes := k.answer["/exact"]
	require.Greater(k.t, len(codes), exactLimit)
	for i, code := range codes {
		want := http.StatusOK
		if i >= exactLimit {
			want = http.StatusTooManyRequests
		}
		require.Equal(k.t, want, code, "exact rule, request %d of %d (limit %d): answers %v", i+1, len(codes), exactLimit, codes)
	}
}

// requireLeased checks the leased rule's bound: no more than it carves
// (L + ⌊L·t⌋), and no less than L less the tolerance's share, which only
// units stranded on other edges may take from a client.
func (k *counter) requireLeased() {
	k.t.Helper()
	n := k.admitted("/leased")
	require.Greater(k.t, len(k.answer["/leased"]), leasedCarved, "the client asks for more than the bound")
	require.LessOrEqual(k.t, n, leasedCarved, "leased rule: admitted at most L + ⌊L·t⌋")
	require.GreaterOrEqual(k.t, n, leasedLimit-(leasedCarved-leasedLimit), "leased rule: admitted at least L − ⌊L·t⌋")
}

// Edge versions, for counter.by.
const (
	previous = iota // the release CHANGELOG.md names
	current         // this tree
)

// TestMixedFleetSharesItsLimits runs two edges of the previous release and
// two of this tree on one Redis Cluster and one Consul: a client whose
// requests go round the four gets exactly the exact limit, and the leased
// limit within its bound, with both versions admitting part of each.
func TestMixedFleetSharesItsLimits(t *testing.T) {
	f := setup(t)
	salt := testenv.KeyPrefix(t) + "-salt-0123456789"
	var fleet []*edge
	for i := range 4 {
		bin, v, name := f.oldBin, previous, f.release.Version
		if i%2 == 1 {
			bin, v, name = f.newBin, current, "HEAD"
		}
		e := startEdge(t, f, bin, fmt.Sprintf("%s#%d", name, i), salt, 4)
		e.version = v
		fleet = append(fleet, e)
	}
	k := newCounter(t, "198.51.100.7")
	const exactSent, leasedSent = exactLimit + 30, leasedCarved + 25
	for i := range leasedSent {
		e := fleet[i%len(fleet)]
		if i < exactSent {
			k.get(e, "/exact")
		}
		k.get(e, "/leased")
	}
	k.requireExact()
	k.requireLeased()
	for _, path := range []string{"/exact", "/leased"} {
		require.Positive(t, k.by[path][previous], "%s: the release's edges admitted part", path)
		require.Positive(t, k.by[path][current], "%s: this tree's edges admitted part", path)
	}
	t.Logf("exact: %d of %d admitted (%d by %s, %d by HEAD); leased: %d of %d admitted (bound %d..%d)",
		k.admitted("/exact"), exactSent, k.by["/exact"][previous], f.release.Version, k.by["/exact"][current],
		k.admitted("/leased"), leasedSent, leasedLimit-(leasedCarved-leasedLimit), leasedCarved)
}

// TestRollingUpgradeLosesNoCount replaces, one at a time, the two edges
// of the previous release by edges of this tree while a client counts
// through them: the exact limit admits exactly its limit over the whole
// roll (the edges that come see every unit the edges that went counted)
// and the leased one stays within its bound.
func TestRollingUpgradeLosesNoCount(t *testing.T) {
	f := setup(t)
	roll(t, f, previous, current)
}

// TestRollingDowngradeLosesNoCount is the roll back: this tree's edges
// replaced by the previous release's.
func TestRollingDowngradeLosesNoCount(t *testing.T) {
	f := setup(t)
	roll(t, f, current, previous)
}

func roll(t *testing.T, f *fleetEnv, from, to int) {
	salt := testenv.KeyPrefix(t) + "-salt-0123456789"
	start := func(v, slot int) *edge {
		bin, name := f.oldBin, f.release.Version
		if v == current {
			bin, name = f.newBin, "HEAD"
		}
		e := startEdge(t, f, bin, fmt.Sprintf("%s#%d", name, slot), salt, 2)
		e.version = v
		return e
	}
	fleet := []*edge{start(from, 0), start(from, 1)}
	k := newCounter(t, "198.51.100.9")
	// Three phases: both edges of the old version; one replaced; both. The
	// exact limit is crossed in the middle one, and the last is denied
	// whole by edges that counted none of it.
	exact := []int{40, 30, 20}
	leased := []int{50, 45, 35}
	for phase := range 3 {
		switch phase {
		case 1, 2:
			slot := phase - 1
			fleet[slot].stop(t)
			fleet[slot] = start(to, slot)
		}
		for i := range leased[phase] {
			e := fleet[i%2]
			if i < exact[phase] {
				k.get(e, "/exact")
			}
			k.get(e, "/leased")
		}
	}
	k.requireExact()
	k.requireLeased()
	require.Positive(t, k.by["/exact"][from], "the outgoing version admitted part")
	require.Positive(t, k.by["/exact"][to], "the incoming version admitted part")
	t.Logf("exact: %d of %d admitted (%d by the outgoing version); leased: %d of %d admitted (bound %d..%d)",
		k.admitted("/exact"), len(k.answer["/exact"]), k.by["/exact"][from], k.admitted("/leased"), len(k.answer["/leased"]),
		leasedLimit-(leasedCarved-leasedLimit), leasedCarved)
}
