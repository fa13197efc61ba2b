package region

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// largeDoc is a rules document stored in parts (over InlineMax), told
// apart by tag.
func largeDoc(tag string) []byte {
	var b strings.Builder
	b.WriteString("version: 1\nrules:\n")
	for i := 0; b.Len() <= InlineMax+PartSize/2; i++ {
		fmt.Fprintf(&b, "  - {id: %s-%06d, match: {hosts: [shop-%06d.example.net]}, key: [ip], algorithm: fixed_window, limit: 600, window: 1h}\n", tag, i, i)
	}
	return []byte(b.String())
}

// A push that commits its manifest while CollectParts runs (after it read
// the documents, before it deletes) keeps its parts: the deletion's
// transaction checks the documents it read and fails, and collecting reads
// again.
func TestCollectPartsKeepsACommittedManifest(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := largeDoc("a"), largeDoc("b")
	_, err := rc.Push(ctx, "eu-west", rc.Layout().GlobalRules(), a, 0, Entry{Kind: KindGlobalRules, Version: "a"})
	require.NoError(t, err)

	// Another operator's push of the region document, its parts written.
	_, _, err = rc.pushParts(ctx, "eu-west", b, "b")
	require.NoError(t, err)
	committed := false
	rc.beforeCollect = func() {
		if committed {
			return
		}
		committed = true
		_, err := rc.Push(ctx, "eu-west", rc.Layout().RegionRules("eu-west"), b, 0, Entry{Kind: KindRegionRules, Version: "b"})
		require.NoError(t, err)
	}
	_, err = rc.CollectParts(ctx, "eu-west")
	require.NoError(t, err)
	require.True(t, committed)

	d, err := rc.ReadDocs(ctx, "eu-west")
	require.NoError(t, err, "every part the manifests name is there")
	require.Equal(t, a, d.Global)
	require.Equal(t, b, d.Region)
}

// Two operators push the global document at once, each pushing again on a
// conflict and collecting parts after a push that landed, as regionctl
// does. Every round, each gets either success or a check-and-set conflict,
// and the document in force is complete and one of the two.
func TestConcurrentPushesInParts(t *testing.T) {
	rc := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key := rc.Layout().GlobalRules()
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		docs := [2][]byte{largeDoc(fmt.Sprintf("r%d-a", round)), largeDoc(fmt.Sprintf("r%d-b", round))}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for op := range 2 {
			wg.Go(func() {
				for try := range 2 { // push, and once more after a conflict
					_, idx, err := rc.Get(ctx, "eu-west", key)
					if err != nil {
						errs[op] = err
						return
					}
					_, err = rc.Push(ctx, "eu-west", key, docs[op], idx, Entry{Kind: KindGlobalRules, Version: fmt.Sprint(round, op, try)})
					errs[op] = err
					if err == nil {
						_, errs[op] = rc.CollectParts(ctx, "eu-west")
						return
					}
					if !errors.Is(err, ErrConflict) {
						return
					}
				}
			})
		}
		wg.Wait()
		for op, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, ErrConflict, "round %d, operator %d", round, op)
			}
		}
		d, err := rc.ReadDocs(ctx, "eu-west")
		require.NoError(t, err, "round %d: the document in force is complete", round)
		require.True(t, string(d.Global) == string(docs[0]) || string(d.Global) == string(docs[1]), "round %d: the document in force is one of the two", round)
	}
}
