// Shedder tuning: the board SREs choose good/bad/start_after/full_after on.
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';
import { board, datasource, green, orange, rate, red, row, sel, statPanel, tablePanel, timeSeries, valueMap } from './common';

const byNode = 'region, pop, instance';
const nodeLegend = '{{region}}/{{pop}} {{instance}}';

export function shedderBoard(): dashboard.Dashboard {
  // The load time (in ms) is the annotation's time, so the mark sits where
  // the settings took effect, not at the next evaluation step.
  const annotationExpr = `max by (region, pop, version) (edgeguard_shedder_settings_loaded_timestamp_seconds{${sel}} * on (instance, job) group_left (version) edgeguard_shedder_settings_info{${sel}}) * 1000`;
  const settingsChange = new dashboard.AnnotationQueryBuilder()
    .name('Shedder settings change')
    .datasource(datasource)
    .enable(true)
    .iconColor('purple')
    .target(new prometheus.DataqueryBuilder().refId('Anno').expr(annotationExpr))
    .expr(annotationExpr)
    .useValueForTime(true)
    .titleFormat('shedder settings {{version}}')
    .textFormat('{{region}}/{{pop}} loaded shedder settings version {{version}} (regionctl shedder get --region {{region}})')
    .tagKeys('region,pop,version')
    .step('15s');

  return board('edgeguard-shedder', 'edgeguard / Shedder tuning',
    'Worker-utilization load shedder: utilization against good/bad, the shed level S and its cut-off tier, offered and shed traffic per tier, the worker cap. Purple marks are shedder settings changes.',
    ['shedder'])
    .annotation(settingsChange)
    .withRow(row('Ramp'))
    .withPanel(timeSeries({
      title: 'Utilization against good and bad',
      description: 'Smoothed worker utilization (busy workers / capacity) per edge, with the ramp thresholds. Below good the shed level recovers; between good and bad it holds; from bad it climbs. Sustained utilization above bad with nothing shed yet means start_after is still running; utilization that never reaches good under real overload means the origin, not the workers, is the bottleneck: lower the worker capacity or good.',
      unit: 'percentunit', min: 0, max: 1,
      thresholds: [green(), orange(0.7), red(0.8)],
      targets: [
        { expr: `max by (${byNode}) (edgeguard_shedder_utilization{${sel}})`, legend: nodeLegend },
        { expr: `max by (threshold) (edgeguard_shedder_threshold{${sel}})`, legend: 'threshold {{threshold}}' },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Shed level S',
      description: 'The shedder\'s integrated level per edge: at or below 0 nothing is shed, 1 sheds every sheddable tier. It rests at -start_after/full_after. A level that climbs on short bursts means start_after is too short; one that stays at 1 long after the load passed means full_after is too long. Try candidates with regionctl shedder simulate, apply with regionctl shedder set.',
      unit: 'none', min: -1, max: 1,
      thresholds: [green(), orange(0), red(0.5)],
      targets: [{ expr: `max by (${byNode}) (edgeguard_shedder_level{${sel}})`, legend: nodeLegend }],
    }))
    .withPanel(statPanel({
      title: 'Cut-off tier',
      description: 'The highest tier losing requests on each edge (none, test, read, write; critical is never shed by the ramp). read or write being cut means users notice: check the critical success ratio and the origin\'s capacity.',
      unit: 'none',
      thresholds: [green(), orange(0), red(1)],
      mappings: valueMap({ '-1': { text: 'none', color: 'green' }, '0': { text: 'test', color: 'yellow' }, '1': { text: 'read', color: 'orange' }, '2': { text: 'write', color: 'red' } }),
      targets: [{ expr: `max by (${byNode}) (edgeguard_shedder_cutoff_tier{${sel}})`, legend: nodeLegend }],
      width: 8,
    }))
    .withPanel(statPanel({
      title: 'Critical-tier success ratio',
      description: 'Share of critical-tier requests not answered 503 (shed, no worker, rate limiting unavailable) per PoP; 429s are policy, not capacity, and count as served. Below 99% the worker cap is too small for critical traffic alone or critical requests time out waiting for a worker: raise --workers or critical_queue_timeout (critical requests wait up to it, 2 s by default, in queue places of their own), and check the origin.',
      unit: 'percentunit', min: 0, max: 1,
      thresholds: [red(), orange(0.99), green(0.999)],
      targets: [{
        expr: `1 - (sum by (region, pop) (${rate('edgeguard_edge_requests_total', 'tier="critical", outcome=~"shed|no_worker|unavailable"')}) / sum by (region, pop) (${rate('edgeguard_edge_requests_total', 'tier="critical"')}))`,
        legend: '{{region}}/{{pop}}',
      }],
      width: 8,
    }))
    .withPanel(tablePanel({
      title: 'Shedder settings in force',
      description: 'The shedder settings version (a hash of the settings) each edge runs. Edges of one region on different versions have not converged: run regionctl shedder get --region R and compare.',
      unit: 'none',
      thresholds: [green()],
      targets: [
        { expr: `max by (${byNode}, version) (edgeguard_shedder_settings_info{${sel}})`, legend: '{{version}}', instant: true },
      ],
      width: 8, height: 6,
    }))
    .withRow(row('Traffic per tier'))
    .withPanel(timeSeries({
      title: 'Offered traffic per tier',
      description: 'Requests offered to the shedder per tier, before shedding. The cut-off falls over these shares (lowest tier first), so a large test/read share gives the ramp room before writes suffer.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, tier) (${rate('edgeguard_shedder_requests_total')})`, legend: '{{region}} {{tier}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Rejected per tier and reason',
      description: 'Requests answered 503 by the shedder per tier: ramp (shed level), queue_full and queue_timeout (the worker cap). Worker-cap rejections of critical traffic mean the cap, not the ramp, is limiting: the ramp reacts too slowly (shorten start_after) or the cap is too small.',
      unit: 'reqps', min: 0,
      thresholds: [green(), red(1)],
      targets: [{ expr: `sum by (region, tier, reason) (${rate('edgeguard_shedder_rejected_total')}) > 0`, legend: '{{region}} {{tier}} {{reason}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Requests by tier and outcome',
      description: 'Every request by its shedder tier and outcome (proxied, denied 429, shed 503, no_worker 503, unavailable 503). Shed and no_worker in the critical tier need action at once.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (tier, outcome) (${rate('edgeguard_edge_requests_total')}) > 0`, legend: '{{tier}} {{outcome}}' }],
      width: 24,
    }))
    .withRow(row('Workers'))
    .withPanel(timeSeries({
      title: 'Workers busy and capacity',
      description: 'Worker slots in use against the hard cap per edge. Busy pinned at capacity means requests queue (see queue wait) and the ramp should be shedding; if it is not, utilization has not stayed above bad for start_after yet.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (${byNode}) (edgeguard_shedder_workers_busy{${sel}})`, legend: 'busy ' + nodeLegend },
        { expr: `sum by (${byNode}) (edgeguard_shedder_workers_capacity{${sel}})`, legend: 'capacity ' + nodeLegend },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Queue wait p99',
      description: 'p99 time requests waited for a worker slot, per PoP and tier (only requests that had to queue). Lower tiers wait up to queue_timeout (50 ms by default), critical requests up to critical_queue_timeout (2 s): a tier close to its timeout is timing out in the queue: shed earlier (lower bad or start_after) or add workers.',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.025), red(0.05)],
      targets: [{ expr: `histogram_quantile(0.99, sum by (le, region, pop, tier) (${rate('edgeguard_shedder_queue_wait_seconds_bucket')}))`, legend: '{{region}}/{{pop}} {{tier}}' }],
    }))
    .withPanel(statPanel({
      title: 'Shedding per PoP',
      description: 'The highest shed level among each PoP\'s edges. Above 0 the PoP is turning sheddable traffic away; sustained for minutes, add capacity or move traffic (the SustainedShedding alert fires).',
      unit: 'percentunit', min: 0, max: 1,
      thresholds: [green(), orange(0.01), red(0.5)],
      targets: [{ expr: `clamp_min(max by (region, pop) (edgeguard_shedder_level{${sel}}), 0)`, legend: '{{region}}/{{pop}}' }],
      width: 24, height: 5,
    }))
    .withRow(row('Host shares'))
    .withPanel(timeSeries({
      title: 'Requests in flight per host against its share',
      description: 'The hosts with the most requests in flight on each edge (host_share.tracked_hosts are tracked by name, the rest as _other; while the host table lists hosts, its entries: a wildcard entry\'s hosts under its pattern, the hosts it does not list as _other) against each host\'s fair share of the workers (workers / hosts active in the last 2 s; of the adaptive origin limit while it is enforced and smaller). A host at its share while the edge is busy is the one being shed: its requests get 503 host_share (see Rejected per tier and reason, and Requests by tier and outcome), and its slow origin or flood is why; the other hosts keep their shares. A host pinned at its share for long: check its origin (edgeguard_origin_* by pool) and give its pool a concurrency limit in the host table; a share too small for every host\'s bursts: add workers.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `topk(10, max by (region, pop, host) (edgeguard_shedder_host_in_flight{${sel}}))`, legend: '{{region}}/{{pop}} {{host}}' },
        { expr: `max by (region, pop) (edgeguard_shedder_host_share{${sel}})`, legend: 'share {{region}}/{{pop}}' },
        { expr: `topk(10, max by (region, pop, host) (edgeguard_shedder_host_queued{${sel}}) > 0)`, legend: 'queued {{region}}/{{pop}} {{host}}' },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Host share waits and the rate share',
      description: 'Why a host is being shed. Waits per second by outcome: a request over its host\'s share waits in the host\'s queue, holding no worker, and is admitted when a place frees, answered 503 host_share after host_share.queue_timeout (timed_out) or at once while host_share.max_queued are waiting (full), or leaves (client_gone). The host waiting is the one with queued requests in Requests in flight per host against its share. The rate share (requests a second a host of the default weight may have admitted) is above 0 only while the edge\'s CPU is at host_share.cpu_busy or more and another host, active in the last 2 s, is not held by its share of the workers (one waiting for its slow origin could not use the CPU): then the busiest host is held to it, however fast its origin (a flood), and waits too. timed_out and full steady with no rate share: a slow origin holds its share of the workers; give its pool a concurrency limit in the host table. With a rate share above 0: the edge\'s CPU is what runs out, and the host waiting floods it: rate-limit its clients, or add edges. Waits admitted but few timed_out: the shares absorb bursts as designed.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region, pop, outcome) (${rate('edgeguard_shedder_host_queue_waits_total')}) > 0`, legend: '{{region}}/{{pop}} {{outcome}}' },
        { expr: `max by (region, pop) (edgeguard_shedder_host_rate_share{${sel}})`, legend: 'rate share {{region}}/{{pop}}' },
      ],
    }))
    .withRow(row('Pool concurrency limits'))
    .withPanel(timeSeries({
      title: 'Pool requests in flight and queued against the limit',
      description: 'Per edge and origin pool with a concurrency limit (host table pool field concurrency, or --origin-concurrency-limit for the --origin pool; pools without one have no series): its requests in flight against the limit in force (the learned one with adaptive: true), and the requests waiting in its queue, which hold no worker. In flight pinned at the limit with a queue means the pool\'s origin is the bottleneck and its hosts get 503 pool_limit while the others keep the workers (see Pool refusals). If the origin has room (its latency is flat), raise the limit; if it is slow, fix or scale the origin: a longer queue only adds its wait to every answer. A limit that keeps falling with adaptive: true means the origin\'s latency is rising.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `max by (${byNode}, pool) (edgeguard_origin_concurrency_limit{${sel}})`, legend: 'limit {{pool}} ' + nodeLegend },
        { expr: `sum by (${byNode}, pool) (edgeguard_origin_concurrency_in_flight{${sel}})`, legend: 'in flight {{pool}} ' + nodeLegend },
        { expr: `sum by (${byNode}, pool) (edgeguard_origin_concurrency_queued{${sel}})`, legend: 'queued {{pool}} ' + nodeLegend },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Pool refusals by reason',
      description: 'Requests answered 503 pool_limit per pool and reason: queue_full (the limit reached and the pool\'s queue full, or no queue), queue_timeout (waited queue_timeout in the queue without a place), gone (the client left while it waited). Critical requests are never refused here. Steady queue_full with in flight at the limit: the origin is saturated for this edge (raise the limit only if the origin has room; else scale it). queue_timeout with a queue that is rarely full: queue_timeout is shorter than one origin answer, so waiting cannot help; shorten the queue rather than lengthen the timeout. Refusals on one PoP only: its edges each hold the limit, so a PoP with more traffic per edge reaches it first.',
      unit: 'reqps', min: 0,
      thresholds: [green(), red(1)],
      targets: [{ expr: `sum by (region, pop, pool, reason) (${rate('edgeguard_origin_concurrency_refused_total')}) > 0`, legend: '{{region}}/{{pop}} {{pool}} {{reason}}' }],
    }))
    .withRow(row('Adaptive origin limit'))
    .withPanel(timeSeries({
      title: 'Learned limit and origin requests in flight',
      description: 'The adaptive concurrency limit each edge learned from its origin\'s latency, against its origin requests in flight. It is learned even with adaptive.enabled off (adaptive_enabled 0), so it can be watched before it is trusted. A limit falling while traffic is steady means the origin is slowing down. The floor is the lowest it goes: adaptive.min_limit split between the region\'s edges.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `max by (${byNode}) (edgeguard_shedder_adaptive_limit{${sel}})`, legend: 'limit ' + nodeLegend },
        { expr: `sum by (${byNode}) (edgeguard_shedder_adaptive_in_flight{${sel}})`, legend: 'in flight ' + nodeLegend },
        { expr: `max by (${byNode}) (edgeguard_shedder_adaptive_floor{${sel}})`, legend: 'floor ' + nodeLegend },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Gradient and origin latency',
      description: 'gradient = minRTT·(1+buffer) / sampleRTT, clamped to [0.5, 2]: below 1 the origin queues (or got slower at the same concurrency) and the limit shrinks; at or above 1 it grows while traffic uses it. minRTT is the no-queue latency learned from live traffic; sampleRTT the last window\'s median.',
      unit: 'none', min: 0,
      thresholds: [red(), orange(0.8), green(1)],
      targets: [
        { expr: `min by (${byNode}) (edgeguard_shedder_adaptive_gradient{${sel}})`, legend: 'gradient ' + nodeLegend },
        { expr: `max by (${byNode}) (edgeguard_shedder_adaptive_sample_rtt_seconds{${sel}}) / max by (${byNode}) (edgeguard_shedder_adaptive_min_rtt_seconds{${sel}} > 0)`, legend: 'sampleRTT/minRTT ' + nodeLegend },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Guaranteed share and in flight per tier',
      description: 'Each tier\'s guaranteed share of the learned limit (adaptive.shares × limit, in requests) against its origin requests in flight. A tier is never refused under its share; the tiers below cannot use it. Critical is never refused by the limit, only counted.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (tier) (edgeguard_shedder_adaptive_share{${sel}})`, legend: 'share {{tier}}' },
        { expr: `sum by (tier) (edgeguard_shedder_adaptive_in_flight{${sel}})`, legend: 'in flight {{tier}}' },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Runtime lag',
      description: 'The edge\'s own lag per sample: the sampler tick\'s lateness, the scheduler\'s p99 latency and the longest GC pause. With runtime_lag_bad set, lag/runtime_lag_bad drives the ramp like utilization: a CPU-starved or GC-bound edge sheds while its workers look idle.',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.05), red(0.1)],
      targets: [{ expr: `max by (${byNode}) (edgeguard_shedder_runtime_lag_seconds{${sel}})`, legend: nodeLegend }],
    }))
    .build();
}
