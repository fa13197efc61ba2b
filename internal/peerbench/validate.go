package peerbench

import (
	"errors"
	"fmt"
)

func (c StreamConfig) validate() error {
	var errs []error
	if c.Sets < 1 || c.Clients < 1 || c.Requests < 1 {
		errs = append(errs, fmt.Errorf("sets (%d), clients (%d) and requests (%d) must each be at least 1", c.Sets, c.Clients, c.Requests))
	}
	if c.TTFBSize < 1 || c.TTFBSize > maxObject {
		errs = append(errs, fmt.Errorf("time-to-first-byte object size %d: want 1 to %d bytes", c.TTFBSize, int64(maxObject)))
	}
	if len(c.Sizes) != len(c.Volumes) {
		errs = append(errs, fmt.Errorf("%d sizes but %d volumes", len(c.Sizes), len(c.Volumes)))
	}
	for i, sz := range c.Sizes {
		if sz < 1 || sz > maxObject {
			errs = append(errs, fmt.Errorf("object size %d: want 1 to %d bytes", sz, int64(maxObject)))
		}
		if i < len(c.Volumes) && c.Volumes[i] < 1 {
			errs = append(errs, fmt.Errorf("volume %d for size %d: want at least 1 byte", c.Volumes[i], sz))
		}
	}
	return errors.Join(errs...)
}

func (c SlowConfig) validate() error {
	var errs []error
	if c.Clients < 1 {
		errs = append(errs, fmt.Errorf("clients %d: want at least 1", c.Clients))
	}
	if c.Rate < 1 {
		errs = append(errs, fmt.Errorf("rate %d: want at least 1 byte per second", c.Rate))
	}
	if c.Hold <= 0 || c.Ramp < 0 {
		errs = append(errs, fmt.Errorf("hold %s must be positive, ramp %s not negative", c.Hold, c.Ramp))
	}
	if c.ObjectSize < 1 || c.ObjectSize > maxObject {
		errs = append(errs, fmt.Errorf("object size %d: want 1 to %d bytes", c.ObjectSize, int64(maxObject)))
	}
	if c.RcvBuf < 1 {
		errs = append(errs, fmt.Errorf("SO_RCVBUF %d: want at least 1", c.RcvBuf))
	}
	return errors.Join(errs...)
}

func (c BigConfig) validate() error {
	if c.Size < 0 || c.Size > maxObject {
		return fmt.Errorf("object size %d: want 0 to %d bytes", c.Size, int64(maxObject))
	}
	return nil
}
