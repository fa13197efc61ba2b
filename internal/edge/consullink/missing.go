package consullink

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Documents the edge reads from Consul, as the document label of
// edgeguard_edge_consul_documents_missing names them.
const (
	docRules       = "rules"
	docShedder     = "shedder"
	docEnforcement = "enforcement"
	DocRLS         = "rls"     // the rate limit service's documents, rls/<region>/
	DocCatalog     = "catalog" // the region catalog, regions/catalog (global rules)
	DocHosts       = "hosts"   // the host table, hosts/<region>
)

// missingDocs are the documents the edge found absent in Consul while it
// held a good one, and kept. An absent document never removes what it set:
// a Consul agent rebuilt empty, a snapshot restored from before a document
// existed or a key deleted by hand would otherwise switch off every edge
// of the region at once. Clearing takes an explicit document (rules: [],
// the shedder's defaults, the switch enforce). Each is a gauge at 1 while
// missing, and a line of /readyz's body; readiness stays 200, since the
// last good document is what the region last pushed.
type missingDocs struct {
	gauge *prometheus.GaugeVec
	mu    sync.Mutex
	since map[string]time.Time // document → when first found missing
}

func newMissingDocs(g *prometheus.GaugeVec) *missingDocs {
	return &missingDocs{gauge: g, since: map[string]time.Time{}}
}

// NewMissingGauge is the gauge, each document's series at 0 from the start.
func NewMissingGauge() *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "edgeguard_edge_consul_documents_missing",
		Help: "1 while the edge keeps its last good document of this kind (rules, shedder, enforcement, rls: every rate limit service document, catalog: the region catalog) because Consul holds none where it held one: a Consul rebuilt empty, a key deleted by hand. 0 otherwise. Clearing takes an explicit document, never an absent one.",
	}, []string{"document"})
	for _, d := range []string{docRules, docShedder, docEnforcement, DocRLS, DocCatalog, DocHosts} {
		g.WithLabelValues(d).Set(0)
	}
	return g
}

// set records whether doc is missing and reports whether that changed.
func (m *missingDocs) set(doc string, missing bool) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, was := m.since[doc]
	if was == missing {
		return false
	}
	if missing {
		m.since[doc] = time.Now()
		m.gauge.WithLabelValues(doc).Set(1)
	} else {
		delete(m.since, doc)
		m.gauge.WithLabelValues(doc).Set(0)
	}
	return true
}

// detail is readiness's line: "" when nothing is missing.
func (m *missingDocs) detail() string {
	if m == nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.since) == 0 {
		return ""
	}
	docs := make([]string, 0, len(m.since))
	for d, t := range m.since {
		docs = append(docs, fmt.Sprintf("%s (since %s)", d, t.UTC().Format(time.RFC3339)))
	}
	slices.Sort(docs)
	return "documents missing in consul, the last good ones kept: " + strings.Join(docs, ", ")
}
