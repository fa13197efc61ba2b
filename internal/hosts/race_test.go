//go:build race

package hosts

// scaleHosts is the size of the table TestParseAtScale parses. The race
// detector makes YAML parsing several times slower; with -race (as `make
// test` runs) the test parses 20,000 hosts, without it the most a table
// takes.
const scaleHosts = 20_000
