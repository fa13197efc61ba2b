// Package population is a deterministic set of load-test clients: N
// identities, each with an IPv4 or IPv6 address (every IPv6 client in its
// own /64, since the edge keys IPv6 by /64) and an API key, picked with
// uniform or Zipf popularity. The same options always give the same
// identities, so every VU of a run (and every run) shares one population.
package population

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// Distributions.
const (
	Uniform = "uniform"
	Zipf    = "zipf"
)

// Options shape a population. Zero values take the defaults of Default().
type Options struct {
	// Size is the number of identities.
	Size int `js:"size" json:"size"`
	// Seed makes the population (and each picker built with the same
	// stream number) reproducible.
	Seed uint64 `js:"seed" json:"seed"`
	// IPv6Share is the fraction of identities that are IPv6 clients.
	IPv6Share float64 `js:"ipv6Share" json:"ipv6Share"`
	// RoamingShare is the fraction of identities marked as roaming: the
	// scenario sends them to more than one region.
	RoamingShare float64 `js:"roamingShare" json:"roamingShare"`
	// Distribution is "uniform" or "zipf".
	Distribution string `js:"distribution" json:"distribution"`
	// ZipfS (> 1) and ZipfV (>= 1) are the Zipf parameters: identity k is
	// picked with probability proportional to (v+k)^-s.
	ZipfS float64 `js:"zipfS" json:"zipfS"`
	ZipfV float64 `js:"zipfV" json:"zipfV"`
}

// Default returns the defaults: 1000 identities, seed 1, 25% IPv6, 10%
// roaming, uniform.
func Default() Options {
	return Options{Size: 1000, Seed: 1, IPv6Share: 0.25, RoamingShare: 0.1, Distribution: Uniform, ZipfS: 1.1, ZipfV: 1}
}

// Validate reports every problem at once.
func (o Options) Validate() error {
	var errs []error
	if o.Size < 1 || o.Size > 1<<24 {
		errs = append(errs, fmt.Errorf("size %d: want 1..%d", o.Size, 1<<24))
	}
	if o.IPv6Share < 0 || o.IPv6Share > 1 {
		errs = append(errs, fmt.Errorf("ipv6Share %v: want 0..1", o.IPv6Share))
	}
	if o.RoamingShare < 0 || o.RoamingShare > 1 {
		errs = append(errs, fmt.Errorf("roamingShare %v: want 0..1", o.RoamingShare))
	}
	switch o.Distribution {
	case Uniform:
	case Zipf:
		if o.ZipfS <= 1 {
			errs = append(errs, fmt.Errorf("zipfS %v: want > 1", o.ZipfS))
		}
		if o.ZipfV < 1 {
			errs = append(errs, fmt.Errorf("zipfV %v: want >= 1", o.ZipfV))
		}
	default:
		errs = append(errs, fmt.Errorf("distribution %q: want %q or %q", o.Distribution, Uniform, Zipf))
	}
	return errors.Join(errs...)
}

// Identity is one client.
type Identity struct {
	ID int `json:"id"`
	// Addr is the client address sent as X-Forwarded-For; for IPv6 the
	// interface identifier varies per request (see Population.Addr) while
	// the /64 stays the client's.
	Addr    netip.Addr `json:"addr"`
	IPv6    bool       `json:"ipv6"`
	APIKey  string     `json:"apiKey"`
	Roaming bool       `json:"roaming"`
}

// Population is immutable once built and safe for concurrent use.
type Population struct {
	opts Options
	ids  []Identity
}

// New builds the population.
func New(o Options) (*Population, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("population options: %w", err)
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x65646765)) // "edge"
	// A random permutation of 1..Size gives distinct addresses that do not
	// follow the identity order.
	perm := r.Perm(o.Size)
	p := &Population{opts: o, ids: make([]Identity, o.Size)}
	for i := range p.ids {
		n := uint32(perm[i]) + 1
		id := Identity{ID: i, IPv6: r.Float64() < o.IPv6Share, Roaming: r.Float64() < o.RoamingShare}
		if id.IPv6 {
			// 2001:db8:NNNN:NNNN::/64, one /64 per identity (documentation prefix).
			id.Addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n), 0, 0, 0, 0, 0, 0, 0, 1})
		} else {
			// 10.0.0.0/8 from 10.0.0.1 on; Size is capped below 2^24.
			id.Addr = netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
		}
		id.APIKey = fmt.Sprintf("k-%x-%016x", o.Seed, r.Uint64())
		p.ids[i] = id
	}
	return p, nil
}

// Options returns the options the population was built with.
func (p *Population) Options() Options { return p.opts }

// Len is the number of identities.
func (p *Population) Len() int { return len(p.ids) }

// Get returns identity i.
func (p *Population) Get(i int) (Identity, error) {
	if i < 0 || i >= len(p.ids) {
		return Identity{}, fmt.Errorf("identity %d: want 0..%d", i, len(p.ids)-1)
	}
	return p.ids[i], nil
}

// Picker draws identities with the population's popularity. Each VU owns
// one (a Picker is not safe for concurrent use); stream numbers them so
// each VU's sequence is reproducible.
type Picker struct {
	p    *Population
	r    *rand.Rand
	zipf *rand.Zipf
}

// Picker returns a picker for one stream (e.g. the VU id).
func (p *Population) Picker(stream uint64) *Picker {
	r := rand.New(rand.NewPCG(p.opts.Seed, stream))
	pk := &Picker{p: p, r: r}
	if p.opts.Distribution == Zipf {
		pk.zipf = rand.NewZipf(r, p.opts.ZipfS, p.opts.ZipfV, uint64(len(p.ids)-1))
	}
	return pk
}

// Pick draws one identity.
func (pk *Picker) Pick() Identity {
	if pk.zipf != nil {
		return pk.p.ids[pk.zipf.Uint64()]
	}
	return pk.p.ids[pk.r.IntN(len(pk.p.ids))]
}

// Addr is the address to send for one request of id: IPv4 as is, IPv6 with
// a fresh interface identifier inside the identity's /64 (the edge must
// still count it as the same client).
func (pk *Picker) Addr(id Identity) netip.Addr {
	if !id.IPv6 {
		return id.Addr
	}
	b := id.Addr.As16()
	iid := pk.r.Uint64() | 1 // never the all-zero identifier
	for i := range 8 {
		b[8+i] = byte(iid >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}
