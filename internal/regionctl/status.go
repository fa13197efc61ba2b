package regionctl

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/edgeguard/edgeguard/pkg/region"
)

type edgeStatus struct {
	ID           string `json:"id"`
	Node         string `json:"node"`
	Address      string `json:"address"`
	Region       string `json:"region"` // as the edge registered it
	PoP          string `json:"pop"`
	Healthy      bool   `json:"healthy"`
	RulesVersion string `json:"rules_version"`
	// Version is the edge's release ("" for edges of 0.1.0); Schemas
	// the document schemas it reads, by kind (none: schema 1 of each).
	Version   string         `json:"version"`
	Schemas   map[string]int `json:"schemas,omitempty"`
	Converged bool           `json:"converged"`
	State     string         `json:"state"` // converged, not_converged, unhealthy
	// GlobalShare: home regions the edge cannot reach; it decides their
	// global rules' keys from the static share.
	GlobalShare []string `json:"global_share,omitempty"`
}

type popStatus struct {
	PoP          string       `json:"pop"`
	Edges        int          `json:"edges"`
	Healthy      int          `json:"healthy"`
	NotConverged int          `json:"not_converged"`
	EdgeList     []edgeStatus `json:"edge_list"`
}

type regionStatus struct {
	Region          string      `json:"region"`
	ExpectedVersion string      `json:"expected_version,omitempty"`
	Converged       bool        `json:"converged"`
	Edges           int         `json:"edges"`
	Healthy         int         `json:"healthy"`
	NotConverged    int         `json:"not_converged"`
	PoPs            []popStatus `json:"pops"`
	Error           string      `json:"error,omitempty"`
	ExitCode        int         `json:"exit_code"`

	// GlobalShare counts the healthy edges deciding some global rules
	// from the static share (a home region unreachable).
	GlobalShare int `json:"global_share"`
}

// regions status [--region R]
func (a *app) regionsStatus(args []string) error {
	fs := a.flags("regions status", "[--region R]")
	var only string
	fs.StringVar(&only, "region", "", "show only this region")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("regions status takes no arguments, got %q", pos)
	}
	s, err := a.connect()
	if err != nil {
		return err
	}
	defer s.close()
	var regions []string
	if only != "" {
		if err := s.checkRegion(only); err != nil {
			return err
		}
		regions = []string{only}
	} else if regions, err = s.allRegions(); err != nil {
		return err
	}

	out := make([]regionStatus, 0, len(regions))
	codes := make([]int, 0, len(regions))
	for _, r := range regions {
		st := s.status(r)
		out = append(out, st)
		codes = append(codes, st.ExitCode)
	}
	code := combine(codes)
	if a.json() {
		a.emitJSON(map[string]any{"converged": code == ExitOK, "regions": out, "exit_code": code, "reason": reasonOf(code)})
	} else {
		a.printStatus(out)
	}
	var bad []string
	for _, st := range out {
		switch {
		case st.Error != "":
			bad = append(bad, st.Region+" ("+reasonOf(st.ExitCode)+")")
		case !st.Converged:
			bad = append(bad, fmt.Sprintf("%s (%s)", st.Region, plural(st.NotConverged, "edge")))
		}
	}
	switch {
	case code == ExitOK:
		if !a.json() {
			a.printf("all regions converged\n")
		}
		return nil
	case code == ExitNotConverged:
		return &codedError{code: code, msg: "NOT CONVERGED: " + strings.Join(bad, ", ")}
	}
	return &codedError{code: code, msg: "status incomplete: " + strings.Join(bad, ", ")}
}

// status is one region's convergence: every edge in the catalog against the
// version of the effective rules in the region's KV.
func (s *session) status(r string) regionStatus {
	st := regionStatus{Region: r, PoPs: []popStatus{}}
	fail := func(err error) regionStatus {
		st.ExitCode = exitCode(err)
		st.Error = s.a.message(err)
		return st
	}
	docs, err := s.readDocs(r)
	if err != nil {
		return fail(err)
	}
	expected, effErr := s.a.effectiveVersion(docs)
	st.ExpectedVersion = expected
	edges, err := s.edges(r)
	if err != nil {
		return fail(err)
	}
	slices.SortFunc(edges, func(x, y region.Edge) int {
		return cmp.Or(cmp.Compare(x.PoP, y.PoP), cmp.Compare(x.ID, y.ID), cmp.Compare(x.Node, y.Node))
	})
	for _, e := range edges {
		es := edgeStatus{ID: e.ID, Node: e.Node, Address: e.Address, Region: e.Region, PoP: e.PoP,
			Healthy: e.Healthy, RulesVersion: e.RulesVersion, GlobalShare: e.GlobalShare,
			Version: e.Version, Schemas: e.Schemas}
		if e.Healthy && len(e.GlobalShare) > 0 {
			st.GlobalShare++
		}
		es.Converged = effErr == nil && e.RulesVersion == expected
		switch {
		case !e.Healthy:
			es.State = "unhealthy"
		case es.Converged:
			es.State = "converged"
		default:
			es.State = "not_converged"
		}
		if n := len(st.PoPs); n == 0 || st.PoPs[n-1].PoP != e.PoP {
			st.PoPs = append(st.PoPs, popStatus{PoP: e.PoP})
		}
		p := &st.PoPs[len(st.PoPs)-1]
		p.EdgeList = append(p.EdgeList, es)
		p.Edges++
		st.Edges++
		if e.Healthy {
			p.Healthy++
			st.Healthy++
		}
		if es.State == "not_converged" {
			p.NotConverged++
			st.NotConverged++
		}
	}
	if effErr != nil {
		st.Error = fmt.Sprintf("the stored rules of %s are invalid, so no edge can converge: %s", r, oneLine(effErr))
		st.ExitCode = ExitNotConverged
		return st
	}
	st.Converged = st.NotConverged == 0
	if !st.Converged {
		st.ExitCode = ExitNotConverged
	}
	return st
}

func (a *app) printStatus(out []regionStatus) {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	for _, st := range out {
		switch {
		case st.Error != "" && st.ExitCode != ExitNotConverged:
			fmt.Fprintf(tw, "%s: error: %s\n", st.Region, st.Error)
			continue
		case st.Error != "":
			fmt.Fprintf(tw, "%s: %s\n", st.Region, st.Error)
		}
		summary := fmt.Sprintf("%s healthy of %s", plural(st.Healthy, "edge"), plural(st.Edges, "edge"))
		switch {
		case st.Edges == 0:
			summary = "no edges registered"
		case st.NotConverged > 0:
			summary += fmt.Sprintf(", %d NOT CONVERGED", st.NotConverged)
		default:
			summary += ", converged"
		}
		fmt.Fprintf(tw, "%s: expected rules version %s; %s\n", st.Region, dash(st.ExpectedVersion), summary)
		if st.GlobalShare > 0 {
			fmt.Fprintf(tw, "  global rules: %s deciding from the static share (home region unreachable)\n", plural(st.GlobalShare, "edge"))
		}
		for _, p := range st.PoPs {
			fmt.Fprintf(tw, "  pop %s: %d healthy of %d\n", dash(p.PoP), p.Healthy, p.Edges)
			for _, e := range p.EdgeList {
				health := "healthy"
				if !e.Healthy {
					health = "UNHEALTHY"
				}
				state := map[string]string{"converged": "converged", "not_converged": "NOT CONVERGED", "unhealthy": "unhealthy"}[e.State]
				if !e.Healthy && e.RulesVersion != st.ExpectedVersion {
					state = "unhealthy, not converged"
				}
				if e.Region != "" && e.Region != st.Region {
					state += " (registered for region " + e.Region + ")"
				}
				if len(e.GlobalShare) > 0 {
					state += ", global share for " + strings.Join(e.GlobalShare, ",")
				}
				fmt.Fprintf(tw, "    %s\t%s\t%s\tversion %s\trules %s\t%s\n", e.ID, e.Address, health, versionOf(e.Version), dash(e.RulesVersion), state)
			}
		}
	}
	_ = tw.Flush()
}

// versionOf is an edge's release as status shows it: edges of 0.1.0
// registered none.
func versionOf(v string) string {
	if v == "" {
		return "0.1.0 or older"
	}
	return v
}
