package hosts

import (
	"fmt"
	"testing"
)

// benchTable has n hosts, half exact names (h<i>.example), half
// wildcards (*.w<i>.example), all in one pool.
func benchTable(n int) *Table {
	t := &Table{Schema: 1, Pools: map[string]Pool{"p": {URLs: []string{"http://o:80"}}}, Hosts: map[string]Host{}}
	for i := range n / 2 {
		t.Hosts[fmt.Sprintf("h%d.example", i)] = Host{Pool: "p"}
		t.Hosts[fmt.Sprintf("*.w%d.example", i)] = Host{Pool: "p"}
	}
	return t
}

// BenchmarkLookup looks up, in turn, an exact hit, a wildcard hit two
// labels down and a miss: what it costs must not grow with the table.
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ix := benchTable(n).Index()
			last := n/2 - 1
			hosts := []string{
				fmt.Sprintf("h%d.example", last),
				fmt.Sprintf("a.b.w%d.example", last),
				"www.shop.example.org",
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, _, ok := ix.Lookup(hosts[i%3]); ok != (i%3 != 2) {
					b.Fatal("wrong lookup")
				}
			}
		})
	}
}
