package pipeline

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each label set's child is made once, however many goroutines ask for it
// at once, and children made earlier stay when others are added.
func TestSeriesMakesEachChildOnce(t *testing.T) {
	var s series[string, *int]
	var mu sync.Mutex
	made := map[string]int{}
	child := func(k string) func() *int {
		return func() *int {
			mu.Lock()
			defer mu.Unlock()
			made[k]++
			return new(int)
		}
	}
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	first := map[string]*int{}
	for _, k := range keys {
		first[k] = s.get(k, child(k))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				for _, k := range keys {
					if got := s.get(k, child(k)); got != first[k] {
						t.Errorf("%s: another child than the first", k)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		require.Equal(t, 1, made[k], k)
	}
}
