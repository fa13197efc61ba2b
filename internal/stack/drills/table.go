package drills

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is one drill's line in the table.
type Result struct {
	Drill  string
	Counts map[string]int           // outcome → count
	Times  map[string]time.Duration // what was timed → how long
	Notes  []string
	Err    error
}

func newResult(name string) *Result {
	return &Result{Drill: name, Counts: map[string]int{}, Times: map[string]time.Duration{}}
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// PrintTable writes one line per drill: outcome, counts, times.
func PrintTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DRILL\tRESULT\tCOUNTS\tTIMES")
	for _, r := range results {
		res := "PASS"
		if r.Err != nil {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Drill, res, joinMap(r.Counts, func(v int) string { return fmt.Sprint(v) }),
			joinMap(r.Times, func(d time.Duration) string { return d.Round(time.Millisecond).String() }))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s: %s\n", r.Drill, n)
		}
		if r.Err != nil {
			fmt.Fprintf(w, "  %s: FAILED: %v\n", r.Drill, r.Err)
		}
	}
	return nil
}

func joinMap[V any](m map[string]V, format func(V) string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+format(m[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func sortedNames[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
