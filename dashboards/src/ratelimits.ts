// Rate limits: decisions, where they were decided, the store and Redis.
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { board, green, orange, rate, red, redisSel, row, sel, statPanel, tablePanel, timeSeries, valueMap } from './common';

export function rateLimitsBoard(): dashboard.Dashboard {
  return board('edgeguard-ratelimits', 'edgeguard / Rate limits',
    'Rate-limit decisions by rule, the local prefilter and coalescing, the Redis store with its breakers and fallback, Envoy\'s rate limit service, and Redis itself (from the Redis exporter).',
    ['limiter', 'redis'])
    .withRow(row('Decisions'))
    .withPanel(timeSeries({
      title: 'Decisions by rule and outcome',
      description: 'Rule decisions per second: allowed, denied (429) and shadow_denied (a shadow rule that would have denied). A rule whose shadow_denied rate is what you expect is ready to enforce: set shadow: false and push it with regionctl rules push. Only rules with metrics: true have a line of their own; every other rule is counted under _other.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (rule, decision) (${rate('edgeguard_edge_decisions_total')})`, legend: '{{rule}} {{decision}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Shadow share of rule checks',
      description: 'Share of rule checks that only count (shadow: a rule with shadow: true, or a key the region\'s enforcement switch leaves out), per region, with the share of keys the switch enforces. A region switched to shadow (regionctl enforcement set --region R shadow) shows 100 % shadow; enforce --percent P brings the shadow share down towards the shadow rules\' own share as P rises. A shadow share that does not follow a switch means edges still run the old switch: see the orange marks and regionctl enforcement get.',
      unit: 'percentunit', min: 0, max: 1,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region) (${rate('edgeguard_edge_rule_checks_total', 'mode="shadow"')}) / sum by (region) (${rate('edgeguard_edge_rule_checks_total')})`, legend: '{{region}} shadow share' },
        { expr: `min by (region) (edgeguard_edge_enforced_keys_ratio{${sel}})`, legend: '{{region}} keys enforced by the switch' },
      ],
    }))
    .withPanel(tablePanel({
      title: 'Top denied rules',
      description: 'The ten rules that denied most requests over the dashboard\'s time range. A rule suddenly on top is either an attack (good) or a limit set too low after a push: check regionctl rules history --region R and roll back with regionctl rules rollback if needed. _other holds the rules without metrics: true (opt a rule in to see it here).',
      unit: 'short',
      thresholds: [green(), orange(100), red(10000)],
      targets: [{ expr: `topk(10, sum by (rule) (increase(edgeguard_edge_decisions_total{${sel}, decision="denied"}[$__range])))`, legend: '{{rule}}', instant: true }],
    }))
    .withPanel(timeSeries({
      title: 'Decisions by where they were decided',
      description: 'Checks by reason: the store (redis or memory), prefilter (over-limit cache: denied locally without a Redis call) or fallback (Redis failing: each edge admits its share of what Redis last reported left for the key, and denies an exact rule\'s key it has no answer for). Find out why Redis fails (breaker panel, Redis panels).',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, reason) (${rate('edgeguard_edge_decisions_total')})`, legend: '{{region}} {{reason}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Script calls per request',
      description: 'Redis script commands (edgeguard_limiter_store_calls_total: a batch is one) sent per request that reached the limiter, per PoP. Above the number of rules a request matches means refunds or retries; well below 1 means the prefilter, coalescing and batching save Redis work.',
      unit: 'none', min: 0,
      thresholds: [green(), orange(3), red(5)],
      targets: [{
        expr: `sum by (region, pop) (${rate('edgeguard_limiter_store_calls_total')}) / sum by (region, pop) (${rate('edgeguard_edge_requests_total', 'outcome=~"proxied|denied"')})`,
        legend: '{{region}}/{{pop}}',
      }],
    }))
    .withPanel(timeSeries({
      title: 'Decisions per script call',
      description: 'Decisions carried per Redis script command, per PoP: 1 when every decision goes alone, more when concurrent checks leave as one call of the batch script. It rises with load (batches form while calls are in flight) and costs Redis less per decision.',
      unit: 'none', min: 0,
      thresholds: [green()],
      targets: [{
        expr: `sum by (region, pop) (${rate('edgeguard_limiter_store_call_decisions_total')}) / sum by (region, pop) (${rate('edgeguard_limiter_store_calls_total')})`,
        legend: '{{region}}/{{pop}}',
      }],
    }))
    .withRow(row('Escapes'))
    .withPanel(timeSeries({
      title: 'Escapes by rule',
      description: 'Requests an operator\'s escape applied to, per second, by rule and escape (docs/escapes.md): bypass (allowlisted: not counted), override (the key\'s own limit), limit_header (a trusted peer set the limit), penalised (denied by a penalty), penalty_start (a denial that started one), response_counted and response_blocked (count_if / cost_header rules). A bypass rate that jumps means an allowlisted network or key is flooding: it is never limited, so check who it is.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (rule, escape) (${rate('edgeguard_edge_escapes_total', 'escape!~"limit_header_ignored|cost_header_error"')})`, legend: '{{rule}} {{escape}}' }],
    }))
    .withPanel(timeSeries({
      title: 'Escapes refused and failing',
      description: 'limit_header_ignored: a limit header from an untrusted client (someone trying to raise their own limit) or not a valid limit; cost_header_error: an origin cost header that was garbage or above max_cost (bounded); penalty errors: penalty or block lookups Redis did not answer (requests went on unpenalised); dropped counts: responses a count_if rule could not count because 4,096 counts were waiting for Redis.',
      unit: 'reqps', min: 0,
      thresholds: [green(), orange(1)],
      targets: [
        { expr: `sum by (region, rule, escape) (${rate('edgeguard_edge_escapes_total', 'escape=~"limit_header_ignored|cost_header_error"')})`, legend: '{{region}} {{rule}} {{escape}}' },
        { expr: `sum by (region) (${rate('edgeguard_edge_penalty_errors_total')})`, legend: '{{region}} penalty errors' },
        { expr: `sum by (region) (${rate('edgeguard_edge_response_counts_dropped_total')})`, legend: '{{region}} dropped counts' },
      ],
    }))
    .withRow(row('Store, breakers and fallback'))
    .withPanel(timeSeries({
      title: 'Fallback by reason',
      description: 'Checks the store could not decide, per PoP: error (call failed or timed out), breaker_open (the shard\'s breaker stops calls) or lane_full; and, of those, the exact checks denied for want of Redis\'s answer for their key in its window (clients new to the edge during the outage). Sustained fallback means a Redis shard is down, or silent for --redis-timeout (one that keeps answering is waited for, up to 4 times that); the LimiterFallback alert fires.',
      unit: 'reqps', min: 0,
      thresholds: [green(), red(1)],
      targets: [
        { expr: `sum by (region, pop, reason) (${rate('edgeguard_limiter_fallback_total')})`, legend: '{{region}}/{{pop}} {{reason}}' },
        { expr: `sum by (region, pop) (${rate('edgeguard_limiter_fallback_unknown_total')})`, legend: '{{region}}/{{pop}} denied: no answer for the key' },
      ],
    }))
    .withPanel(statPanel({
      title: 'Breaker state per shard',
      description: 'Worst breaker state per Redis shard (Cluster master address, or "store" for a single master) over the selected edges: closed, open (keys of that shard decided locally) or half-open (probing). An open shard: check that master (Redis panels, redis-cli -h <shard> ping); after a Cluster failover the old master may stay open on edges until they restart.',
      unit: 'none',
      thresholds: [green(), red(1)],
      mappings: valueMap({ '0': { text: 'closed', color: 'green' }, '1': { text: 'open', color: 'red' }, '2': { text: 'half-open', color: 'orange' } }),
      targets: [{ expr: `max by (region, shard) (edgeguard_limiter_breaker_state{${sel}})`, legend: '{{region}} {{shard}}' }],
      width: 12, height: 8,
    }))
    .withPanel(timeSeries({
      title: 'Store call latency',
      description: 'p50 and p99 of one store round trip (all keys of a request), by outcome. p99 close to --redis-timeout (default 250 ms) means Redis is slow: calls past it wait on only while Redis keeps answering, up to 4 times that, then go to the fallback. Check Redis latency and load below.',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.002), red(0.005)],
      targets: [
        { expr: `histogram_quantile(0.99, sum by (le, outcome) (${rate('edgeguard_limiter_store_call_duration_seconds_bucket')}))`, legend: 'p99 {{outcome}}' },
        { expr: `histogram_quantile(0.5, sum by (le, outcome) (${rate('edgeguard_limiter_store_call_duration_seconds_bucket')}))`, legend: 'p50 {{outcome}}' },
      ],
    }))
    .withPanel(timeSeries({
      title: 'Prefilter and coalescing savings',
      description: 'Checks answered without their own Redis call: prefilter hits (denied by the over-limit cache) and coalesced checks (joined another request\'s call for the same key). High values under a flood are the hot-key protection working.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region, pop) (${rate('edgeguard_limiter_prefilter_hits_total')})`, legend: 'prefilter {{region}}/{{pop}}' },
        { expr: `sum by (region, pop) (${rate('edgeguard_limiter_coalesced_checks_total')})`, legend: 'coalesced {{region}}/{{pop}}' },
      ],
    }))
    .withRow(row('Envoy rate limit service'))
    .withPanel(timeSeries({
      title: 'Rate limit service calls by code',
      description: 'ShouldRateLimit calls per second from Envoy (--rls-listen, docs/envoy.md), by overall code: ok, over_limit (Envoy answers 429) or error (the call failed: a malformed request, no document loaded yet, or the store unavailable under --fail-mode closed; Envoy then applies its failure_mode_deny). Errors on every edge of a region: check that it has documents (regionctl rls get --region R) and the edges\' logs.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, code) (${rate('edgeguard_rls_requests_total')})`, legend: '{{region}} {{code}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Rate limit service descriptors by result',
      description: 'Descriptors answered per second, by result: ok, over_limit, shadow_over_limit (over, answered OK: shadow_mode in the document or --rls-shadow), unlimited (the document says unlimited) and no_limit (no descriptor of the document matches: not limited). A rising no_limit share means Envoy sends descriptors the region\'s documents do not know: compare Envoy\'s rate_limits actions with regionctl rls get --region R.',
      unit: 'reqps', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, result) (${rate('edgeguard_rls_descriptors_total')})`, legend: '{{region}} {{result}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Rate limit service latency',
      description: 'p50 and p99 of answering one ShouldRateLimit call, the limiter\'s decision included, per region. Envoy waits for it on every request its filter covers: keep p99 well below the filter\'s timeout (20 ms by default). A p99 that follows the store call latency above is Redis; one that does not is the edge itself (CPU).',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.005), red(0.02)],
      targets: [
        { expr: `histogram_quantile(0.99, sum by (le, region) (${rate('edgeguard_rls_request_duration_seconds_bucket')}))`, legend: 'p99 {{region}}' },
        { expr: `histogram_quantile(0.5, sum by (le, region) (${rate('edgeguard_rls_request_duration_seconds_bucket')}))`, legend: 'p50 {{region}}' },
      ],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Leased rules: carves and units',
      description: 'Rules with accuracy: leased. Carves per second (one store call per batch; the checks decided from a batch make no call), units carved from the store, and units given back unspent (idle keys). Few carves for many decisions is the point of leasing; returned close to carved means the batches outsize the traffic.',
      unit: 'short', min: 0,
      thresholds: [green()],
      targets: [
        { expr: `sum by (region) (${rate('edgeguard_limiter_lease_carves_total')})`, legend: 'carves/s {{region}}' },
        { expr: `sum by (region) (${rate('edgeguard_limiter_lease_carved_units_total')})`, legend: 'carved units/s {{region}}' },
        { expr: `sum by (region) (${rate('edgeguard_limiter_lease_returned_units_total')})`, legend: 'returned units/s {{region}}' },
      ],
      width: 24,
    }))
    .withRow(row('Redis (exporter)'))
    .withPanel(timeSeries({
      title: 'Redis memory used',
      description: 'Memory used per Redis node. Limit keys expire after their window, so steady growth means more distinct clients or longer windows; near maxmemory, Redis evicts or refuses writes and the edges fall back.',
      unit: 'bytes', min: 0,
      thresholds: [green(), orange(1 << 30), red(4 << 30)],
      targets: [{ expr: `sum by (region, instance) (redis_memory_used_bytes{${redisSel}})`, legend: '{{region}} {{instance}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Redis operations',
      description: 'Commands processed per second per Redis node. One node far above the others is a hot slot: look for a client flooding one key (prefilter panel).',
      unit: 'ops', min: 0,
      thresholds: [green()],
      targets: [{ expr: `sum by (region, instance) (rate(redis_commands_processed_total{${redisSel}}[$__rate_interval]))`, legend: '{{region}} {{instance}}' }],
      width: 8,
    }))
    .withPanel(timeSeries({
      title: 'Redis script latency',
      description: 'Mean server-side time of the limiter\'s script commands (EVALSHA/EVAL) per Redis node. It should stay far below --redis-timeout; if it grows, the node is saturated or a key is very large (sliding_log with a big limit).',
      unit: 's', min: 0,
      thresholds: [green(), orange(0.0005), red(0.002)],
      targets: [{
        expr: `sum by (region, instance) (rate(redis_commands_duration_seconds_total{${redisSel}, cmd=~"evalsha|eval"}[$__rate_interval])) / sum by (region, instance) (rate(redis_commands_total{${redisSel}, cmd=~"evalsha|eval"}[$__rate_interval]))`,
        legend: '{{region}} {{instance}}',
      }],
      width: 8,
    }))
    .build();
}
