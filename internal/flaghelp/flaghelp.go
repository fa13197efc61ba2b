// Package flaghelp prints a flag set's help with every flag's default,
// the empty and false ones included: the flag package's PrintDefaults
// leaves a zero default out, so a reader cannot tell "off" from "not
// documented".
package flaghelp

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Default is how a flag's default reads in help and reference tables:
// display's text when it names the flag (a default computed on the
// machine, say), a string flag's value quoted ("" when empty), anything
// else as the flag package spells it (false, 0, 0s).
func Default(f *flag.Flag, display map[string]string) string {
	if d, ok := display[f.Name]; ok {
		return d
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isString := g.Get().(string); isString {
			return strconv.Quote(f.DefValue)
		}
	}
	if f.DefValue == "" {
		return `""`
	}
	return f.DefValue
}

// Print writes the flags of fs in the flag package's layout, each usage
// ending with "(default: X)".
func Print(w io.Writer, fs *flag.FlagSet, display map[string]string) {
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		var b strings.Builder
		b.WriteString("  -" + f.Name)
		if kind != "" {
			b.WriteString(" " + kind)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		fmt.Fprintf(&b, " (default: %s)\n", Default(f, display))
		_, _ = io.WriteString(w, b.String())
	})
}
