// Package lua embeds the limiter's Redis scripts, one per algorithm. Each
// script is the shared prelude (argument parsing, TIME, helpers), the member
// helpers for the algorithms that keep one ZSET member per unit, and the
// algorithm's body; the limiter loads them with SCRIPT LOAD and runs them
// with EVALSHA.
package lua

import (
	"embed"
	"fmt"
)

//go:embed *.lua
var files embed.FS

// Names of the embedded algorithm scripts.
const (
	SlidingLog    = "sliding_log"
	SlidingWindow = "sliding_window"
	GCRA          = "gcra"
	FixedWindow   = "fixed_window"
	Concurrency   = "concurrency"
	// Behaviour is the behaviour layer's script (no prelude: not a limiter
	// algorithm); read it with Plain.
	Behaviour = "behaviour"
)

// Source returns the complete script for an algorithm: prelude plus body.
func Source(name string) (string, error) {
	prelude, err := files.ReadFile("prelude.lua")
	if err != nil {
		return "", fmt.Errorf("reading prelude: %w", err)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %q: %w", name, err)
	}
	src := string(prelude) + "\n"
	if name == SlidingLog || name == Concurrency { // one member per unit
		members, err := files.ReadFile("members.lua")
		if err != nil {
			return "", fmt.Errorf("reading members helpers: %w", err)
		}
		src += string(members) + "\n"
	}
	return src + string(body), nil
}

// Plain returns a script without the prelude.
func Plain(name string) (string, error) {
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %q: %w", name, err)
	}
	return string(body), nil
}
