package drills

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The region rule's requests set beside the global rule's are the admitted
// ones on the same region sent nearest in time to each, so a burst of
// slow requests at the start of a flood weighs on both sets alike.
func TestNearestInTime(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	regional := &tally{replies: []reply{
		{at: ms(0), took: ms(90), region: "a", status: http.StatusOK},
		{at: ms(2), took: ms(80), region: "a", status: http.StatusOK},
		{at: ms(3), took: ms(70), region: "b", status: http.StatusOK},              // another region
		{at: ms(4), took: ms(60), region: "a", status: http.StatusTooManyRequests}, // denied
		{at: ms(500), took: ms(10), region: "a", status: http.StatusOK},
		{at: ms(510), took: ms(11), region: "a", status: http.StatusOK},
		{at: ms(900), took: ms(12), region: "a", status: http.StatusOK},
	}}
	global := &tally{replies: []reply{
		{at: ms(1), took: ms(95), region: "a", status: http.StatusOK},
		{at: ms(1), took: ms(95), region: "b", status: http.StatusOK},
		{at: ms(505), took: ms(9), region: "a", status: http.StatusOK},
		{at: ms(505), took: ms(9), region: "a", status: http.StatusTooManyRequests},
	}}
	tooks := func(tl *tally) []time.Duration {
		var out []time.Duration
		for _, r := range tl.replies {
			out = append(out, r.took)
		}
		return out
	}
	require.Equal(t, []time.Duration{ms(90), ms(80), ms(10), ms(11)}, tooks(regional.nearest(global, "a", 2)))
	// Every region: each reply's neighbours on its own region.
	require.Equal(t, []time.Duration{ms(90), ms(80), ms(70), ms(10), ms(11)}, tooks(regional.nearest(global, "", 2)))
	// Fewer than k on a region: all of them.
	require.Equal(t, []time.Duration{ms(70)}, tooks(regional.nearest(global, "b", 3)))
	// The p90 of the neighbours meets the slow start: 90 ms, where the
	// region rule's requests over the whole span have 80 ms.
	p90, n := regional.nearest(global, "a", 2).quantile("a", 0.9)
	require.Equal(t, ms(90), p90)
	require.Equal(t, 4, n)
}
