// Package suggest finds the name an operator most likely meant, for "did
// you mean" hints on misspelled settings.
package suggest

import "strings"

// Nearest returns the candidate closest to s (case-insensitively, by edit
// distance) when it is near enough to be the likely intent: at most 2
// edits, or a third of s's length for long names. Otherwise "".
func Nearest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	ls := strings.ToLower(s)
	for _, c := range candidates {
		if d := distance(ls, strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD > max(2, len(s)/3) {
		return ""
	}
	return best
}

// distance is Levenshtein's edit distance between a and b.
func distance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
