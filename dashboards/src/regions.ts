// Regions: edge health, rules convergence, Consul, requests and origins.
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { board, green, orange, rate, red, row, sel, statPanel, tablePanel, timeSeries } from './common';

export function regionsBoard(): dashboard.Dashboard {
  return board('edgeguard-regions', 'edgeguard / Regions',
    'Per region and PoP: healthy edges, rules version convergence, Consul watches and rejected documents, request rate and latency, origin health and errors.',
    ['regions'])
    .withRow(row('Edges and rules'))
    .withPanel(statPanel({
      title: 'Ready edges per PoP',
      description: 'Edges answering /readyz 200 (rules loaded, not draining) per region and PoP. Fewer than deployed: an edge is down or draining; regionctl regions status --region R lists each edge and its health.',
      unit: 'short', min: 0,
      thresholds: [red(), orange(1), green(2)],
      targets: [{ expr: `sum by (region, pop) (edgeguard_edge_ready{${sel}})`, legend: '{{region}}/{{pop}}' }],
      width: 12,
    }))
    .withPanel(statPanel({
      title: 'Rules versions per region',
      description: 'Distinct rules versions running in each region: 1 is converged. 2 or more for more than a minute means an edge missed a push (Consul watch failing) or refused the document: regionctl regions status --region R shows which edge is NOT CONVERGED.',
      unit: 'short',
      thresholds: [green(), red(2)],
      targets: [{ expr: `count by (region) (count by (region, version) (edgeguard_edge_rules_info{${sel}}))`, legend: '{{region}}' }],
      width: 12,
    }))
    .withPanel(tablePanel({
      title: 'Rules version per edge',
      description: 'The rules version every edge runs and when it loaded it. An edge on an older version than its PoP stands out here: compare with regionctl rules get --region R --effective.',
      unit: 'none',
      thresholds: [green()],
      targets: [{ expr: `max by (region, pop, instance, version) (edgeguard_edge_rules_info{${sel}})`, legend: '{{version}}', instant: true }],
      width: 12,
    }))
    .withPanel(timeSeries({
      title: 'Consul watch errors and rejected documents',
      description: 'Failed Consul watches/registrations and rule or shedder documents refused as invalid, per edge. Watch errors: the edge cannot reach its Consul agent and keeps the last good rules. Rejected documents: someone pushed an invalid document past validation; regionctl rules history --region R shows it, regionctl rules rollback restores the previous one.',
      unit: 'short', min: 0,
      thresholds: [green(), red(1)],
      targets: [
        { expr: `sum by (region, pop, instance) (increase(edgeguard_edge_consul_errors_total{${sel}}[$__rate_interval]))`, legend: 'consul errors {{region}}/{{pop}} {{instance}}' },
        { expr: `sum by (region, pop, instance) (increase(edgeguard_edge_rules_rejected_total{${sel}}[$__rate_interval]))`, legend: 'rejected {{region}}/{{pop}} {{instance}}' },
      ],
    }))
    .withRow(row('Requests'))
    .withPanel(timeSeries({
      title: 'Request rate by outcome',
      description: 'Requests per second per region by outcome: proxied, denied (429), shed and no_worker (503 from the shedder), unavailable (503 with --fail-mode closed). A region whose proxied rate drops while another rises is failing over (DNS).',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, outcome) (${rate('edgeguard_edge_requests_total')}) > 0`, legend: '{{region}} {{outcome}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Request latency p99',
      description: 'p99 time from request start to response ready for proxied requests, per PoP (origin time included). Compare with the origin latency: the difference is the edge (shedder queue, Redis).',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.25), red(1)],
      targets: [{ expr: `histogram_quantile(0.99, sum by (le, region, pop) (${rate('edgeguard_edge_request_duration_seconds_bucket', 'outcome="proxied"')}))`, legend: '{{region}}/{{pop}}' }],
    }))
    .withRow(row('Global rules (scope: global)'))
    .withPanel(timeSeries({
      title: 'Global lease calls per home region',
      description: 'Calls this region\'s edges make to another region\'s Redis to lease allowance for global rules, per home region and result. They run in the background, never on a request\'s path. Errors mean the link to that home is failing: its keys go to the static share (next panels). About one call per key per lease period on a busy edge; none while the edges hold enough.',
      unit: 'reqps', min: 0,
      thresholds: [green(), red(1)],
      targets: [{ expr: `sum by (region, home, result) (${rate('edgeguard_limiter_global_lease_calls_total')})`, legend: '{{region}} → {{home}} {{result}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Global units leased, returned and settled',
      description: 'Units per second of global-rule allowance this region leased from each home region, gave back unspent (idle keys), and settled (debts paid: what it admitted on overdraft or from the static share, charged to the home by a later lease). Settled spikes after a partition heals; returned close to leased means the batches are too large for the traffic.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region, home) (${rate('edgeguard_limiter_global_leased_units_total')})`, legend: 'leased {{region}} → {{home}}' },
        { expr: `sum by (region, home) (${rate('edgeguard_limiter_global_returned_units_total')})`, legend: 'returned {{region}} → {{home}}' },
        { expr: `sum by (region, home) (${rate('edgeguard_limiter_global_settled_units_total')})`, legend: 'settled {{region}} → {{home}}' },
      ],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Global allowance outstanding and debt',
      description: 'Units this region\'s edges hold leased from each home region, unspent (outstanding), units they admitted that no lease has paid yet (debt: overdraft, static share), and the part of that debt on keys whose home had nothing left (exhausted): no lease is asked for those before the window ends at the home, and their debt ends with it. Debt above the exhausted part that stays after a partition heals is not being settled: check the lease calls\' errors.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region, home) (edgeguard_limiter_global_outstanding_units{${sel}})`, legend: 'outstanding {{region}} → {{home}}' },
        { expr: `sum by (region, home) (edgeguard_limiter_global_debt_units{${sel}})`, legend: 'debt {{region}} → {{home}}' },
        { expr: `sum by (region, home) (edgeguard_limiter_global_debt_exhausted_units{${sel}})`, legend: 'debt on exhausted keys {{region}} → {{home}}' },
      ],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Global rules on the static share',
      description: 'Edges of each region deciding a home region\'s keys from the static share floor(limit / regions) because that home is unreachable (partition, its Redis down), and checks per second so decided. The window may then admit up to L·(1+t) plus each cut-off region\'s share (docs/guarantees.md); regionctl regions status --region R names the edges. Back to 0 when the link heals; the debts are then settled.',
      unit: 'short', min: 0,
      thresholds: [green(), red(1)],
      targets: [
        { expr: `sum by (region, home) (edgeguard_limiter_global_fallback_share{${sel}})`, legend: 'edges on the share {{region}} → {{home}}' },
        { expr: `sum by (region, home) (${rate('edgeguard_limiter_global_decisions_total', 'from="share"')})`, legend: 'checks/s from the share {{region}} → {{home}}' },
      ],
      width: 24,
    }))
    .withRow(row('Origins'))
    .withPanel(statPanel({
      title: 'Healthy origins',
      description: 'Origins in rotation per PoP and origin pool (the lowest over its edges). 0: every request to that pool gets a fast 502; check the origin and its network path from the PoP.',
      unit: 'short', min: 0,
      thresholds: [red(), green(1)],
      targets: [{ expr: `min by (region, pop, pool) (edgeguard_origin_healthy{${sel}})`, legend: '{{region}}/{{pop}} {{pool}}' }],
      width: 8, height: 8,
    }))
    .withPanel(timeSeries({
      title: 'Origin errors by reason',
      description: 'Failed origin attempts per second by reason: connect, tls (handshake or certificate), timeout (504), body_too_large, other (502). Timeouts with a healthy origin mean it is overloaded: its capacity, not the edge, limits throughput.',
      unit: 'reqps', min: 0,
      thresholds: [green(), red(1)],
      targets: [{ expr: `sum by (region, reason) (${rate('edgeguard_origin_errors_total')})`, legend: '{{region}} {{reason}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Origin responses by status class',
      description: 'Responses received from origins by status class (the edge\'s own 502/504 are not included). A rising 5xx share is the origin failing on its own; see the OriginErrors alert.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, code) (${rate('edgeguard_origin_responses_total')})`, legend: '{{region}} {{code}}' }],
      width: 8,
    }))
    .build();
}
