//go:build !unix

package shedder

import "time"

// processCPU is not read here: the rate shares never start.
func processCPU() time.Duration { return 0 }
