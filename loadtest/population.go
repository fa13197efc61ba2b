package edgeguard

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/sobek"

	"github.com/edgeguard/edgeguard/loadtest/internal/population"
)

// Population is one VU's handle on a shared population.
type Population struct {
	mi     *ModuleInstance
	p      *population.Population
	picker *population.Picker
	header string
}

// Client is an identity as scripts see it.
type Client struct {
	ID      int    `js:"id"`
	IP      string `js:"ip"`
	IPv6    bool   `js:"ipv6"`
	APIKey  string `js:"apiKey"`
	Roaming bool   `js:"roaming"`
	// Headers are the request headers that carry the identity: the
	// client's address as X-Forwarded-For (a fresh interface identifier in
	// its /64 for IPv6) and its API key.
	Headers map[string]string `js:"headers"`
}

type populationOptions struct {
	population.Options
	// APIKeyHeader names the header that carries the API key.
	APIKeyHeader string `js:"apiKeyHeader" json:"apiKeyHeader"`
}

// Population is population(opts) for scripts: every VU that asks for the
// same options gets the same identities (built once, in the root module).
func (mi *ModuleInstance) Population(v sobek.Value) (*Population, error) {
	o := populationOptions{Options: population.Default(), APIKeyHeader: "X-API-Key"}
	if v != nil && !sobek.IsUndefined(v) && !sobek.IsNull(v) {
		if err := exportStrict(v, &o); err != nil {
			return nil, fmt.Errorf("population options: %w", err)
		}
	}
	key, err := json.Marshal(o.Options)
	if err != nil {
		return nil, fmt.Errorf("population options: %w", err)
	}
	mi.root.mu.Lock()
	defer mi.root.mu.Unlock()
	p := mi.root.populations[string(key)]
	if p == nil {
		if p, err = population.New(o.Options); err != nil {
			return nil, err
		}
		mi.root.populations[string(key)] = p
	}
	return &Population{mi: mi, p: p, header: o.APIKeyHeader}, nil
}

// Size is the number of identities.
func (p *Population) Size() int { return p.p.Len() }

// Get returns identity i (0-based).
func (p *Population) Get(i int) (*Client, error) {
	id, err := p.p.Get(i)
	if err != nil {
		return nil, err
	}
	return p.client(id)
}

// Pick draws one identity with the population's popularity, from this VU's
// own reproducible stream (seeded by the VU id).
func (p *Population) Pick() (*Client, error) {
	if err := p.ensurePicker(); err != nil {
		return nil, err
	}
	return p.client(p.picker.Pick())
}

func (p *Population) ensurePicker() error {
	if p.picker != nil {
		return nil
	}
	state := p.mi.vu.State()
	if state == nil {
		return fmt.Errorf("pick: %w", errInitContext)
	}
	p.picker = p.p.Picker(state.VUIDGlobal)
	return nil
}

func (p *Population) client(id population.Identity) (*Client, error) {
	if err := p.ensurePicker(); err != nil {
		return nil, err
	}
	addr := p.picker.Addr(id)
	return &Client{
		ID: id.ID, IP: addr.String(), IPv6: id.IPv6, APIKey: id.APIKey, Roaming: id.Roaming,
		Headers: map[string]string{"X-Forwarded-For": addr.String(), p.header: id.APIKey},
	}, nil
}

// exportStrict copies a JS options object into dst via JSON, refusing
// unknown fields (a misspelt option must not be ignored).
func exportStrict(v sobek.Value, dst any) error {
	b, err := json.Marshal(v.Export())
	if err != nil {
		return err
	}
	return decodeStrict(b, dst)
}
