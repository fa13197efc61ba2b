package behavior_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/behavior"
)

// benignClient is one simulated client: its own request sequence.
type benignClient struct {
	rank  int
	times []int64 // ms
	paths []string
	query []string
}

// The benign mix of TestBenignClientsStayNormal, deterministic from its
// seed: 10,000 clients whose request volume follows Zipf popularity
// (s = 1.1: the k-th client sends 1/k^1.1 of the busiest one's volume), each
// under a rule of q = 100 per minute. A client comes in sessions (a page
// load and what follows) at least one window apart, so no window holds more
// than one session: the busiest client's session is 80 requests within
// 3 s, a burst of 0.8× its limit, and no client ever sees a 429. A session
// touches at most 20 distinct routes (a web client's diversity per
// minute), chosen by Zipf (s = 1.1) popularity over the site's 400 routes,
// so popular routes repeat, sometimes back to back; a tenth of the requests
// carry a query that changes (pagination, search).
const (
	benignClients  = 10_000
	benignQuota    = 100
	benignSessions = 8
	siteRoutes     = 400
)

func benignMix(seed uint64) []benignClient {
	r := rand.New(rand.NewPCG(seed, 7))
	routes := rand.NewZipf(r, 1.1, 1, siteRoutes-1)
	out := make([]benignClient, benignClients)
	for k := range out {
		c := benignClient{rank: k + 1}
		perSession := max(1, int(math.Round(0.8*benignQuota/math.Pow(float64(k+1), 1.1))))
		t := int64(1_700_000_000_000) + r.Int64N(60_000)
		for range benignSessions {
			span := int64(3000) // the session's burst
			var distinct []string
			for range perSession {
				path := fmt.Sprintf("/site/%d", routes.Uint64())
				if !slices.Contains(distinct, path) {
					if len(distinct) == 20 {
						path = distinct[r.IntN(len(distinct))]
					} else {
						distinct = append(distinct, path)
					}
				}
				q := ""
				if r.IntN(10) == 0 {
					q = fmt.Sprintf("page=%d", r.IntN(50))
				}
				c.times = append(c.times, t+r.Int64N(span))
				c.paths = append(c.paths, path)
				c.query = append(c.query, q)
			}
			t += 60_000 + r.Int64N(60_000) // the next session: a window or more later
		}
		// Requests in time order (a session's requests came in any order).
		idx := make([]int, len(c.times))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return int(c.times[a] - c.times[b]) })
		sorted := benignClient{rank: c.rank}
		for _, i := range idx {
			sorted.times = append(sorted.times, c.times[i])
			sorted.paths = append(sorted.paths, c.paths[i])
			sorted.query = append(sorted.query, c.query[i])
		}
		out[k] = sorted
	}
	return out
}

func (c benignClient) obs(h behavior.Hasher, i int) behavior.Obs {
	return behavior.Obs{N: 1, Judge: 1, Q: benignQuota, Routes: []uint64{h.Route(c.paths[i])}, FP: h.Fingerprint("GET", c.paths[i], c.query[i], nil)}
}

// TestBenignClientsStayNormal is the false-positive test, with the default
// settings (the same weights and thresholds the detection tests use): at
// most 0.1% of the benign mix's clients may ever be judged above normal.
// The scorer runs on a simulated clock for all 10,000 clients (every
// request through the model, State); the 200 busiest, whose traffic is
// what could score, are also run through lua/behaviour.lua on real Redis,
// request by request at the same times, and must stay normal there too.
func TestBenignClientsStayNormal(t *testing.T) {
	p, args := params(t)
	h := behavior.NewHasher([]byte("benign-salt"))
	mix := benignMix(1)
	above, requests := 0, 0
	var worst int64
	var peak behavior.Raw
	for _, c := range mix {
		var s behavior.State
		flagged := false
		for i := range c.times {
			v := s.Observe(&p, c.obs(h, i), c.times[i])
			worst = max(worst, v.Score)
			peak = behavior.Raw{Burst: max(peak.Burst, v.Raw.Burst), Replay: max(peak.Replay, v.Raw.Replay), Scan: max(peak.Scan, v.Raw.Scan), Denial: max(peak.Denial, v.Raw.Denial)}
			flagged = flagged || v.Level > behavior.Normal
		}
		requests += len(c.times)
		if flagged {
			above++
		}
	}
	t.Logf("model: %d clients, %d requests; %d ever above normal (%.3f%%); highest score %.3f; highest raw signals %s", len(mix), requests, above, 100*float64(above)/float64(len(mix)), float64(worst)/1000, peak)
	require.LessOrEqual(t, above, benignClients/1000, "at most 0.1%% of benign clients above normal")

	c := client(t)
	prefix := testenv.KeyPrefix(t)
	ctx := context.Background()
	require.NoError(t, script.Load(ctx, c).Err())
	aboveRedis, sent := 0, 0
	for _, bc := range mix[:200] {
		keys := behavior.Keys(prefix, fmt.Sprint(bc.rank))
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(bc.times))
		for i := range bc.times {
			cmds[i] = script.EvalSha(ctx, pipe, keys, args.Args(bc.obs(h, i), bc.times[i])...)
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
		flagged := false
		for _, cmd := range cmds {
			vals, err := cmd.Int64Slice()
			require.NoError(t, err)
			v, err := behavior.ParseReply(vals)
			require.NoError(t, err)
			flagged = flagged || v.Level > behavior.Normal
		}
		sent += len(bc.times)
		if flagged {
			aboveRedis++
		}
	}
	t.Logf("redis: the 200 busiest clients, %d requests; %d ever above normal", sent, aboveRedis)
	require.LessOrEqual(t, aboveRedis, benignClients/1000)
}
