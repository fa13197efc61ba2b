// overload.js: one PoP driven to ~3x its region's capacity with a
// test/read/write/critical mix (X-Priority, trusted from the load
// generator). Capacity is the origin's (fixed workers x service time), not
// the load generator's, which shares the cores.
//
//   make loadtest SCENARIO=overload [REGION=us-east] [POP=iad] [CAPACITY=100] [FACTOR=3] [DURATION=2m]
//
// CAPACITY (requests/s) defaults to the region's origin_capacity_rps in the
// outputs. Thresholds: critical success >= 99.9%; the lower tiers are shed
// first (shed share test >= read >= write >= critical, and the test tier
// was shed at all, or the PoP was never overloaded; shares from the edges'
// own counters); the generator sent at least 2x the capacity (it shares
// the cores: the iterations it dropped are reported, not judged).
//
// The generator must not be what saturates (it shares the cores): under
// overload a request waits for the origin's queue, and a critical one also
// for a worker (up to the edges' critical_queue_timeout, 2 s), so each
// tier's VUs are pre-allocated for rate x its typical latency under
// overload (LATENCY, 1 s; LATENCY_CRITICAL, 2 s) and may grow to
// rate x REQUEST_TIMEOUT (5 s): a VU is busy at most one request timeout
// per iteration, so the scenario cannot run out of VUs.
import eg from 'k6/x/edgeguard';
import { correctnessThresholds, finish, loadStack, rulesPath, send } from './lib/stack.js';

const stack = loadStack();
const REGION = __ENV.REGION || (stack.regions['us-east'] ? 'us-east' : stack.regionNames[0]);
const region = stack.regions[REGION];
if (!region) {
  throw new Error(`REGION=${REGION}: not in the stack (have ${stack.regionNames.join(', ')})`);
}
const POP = __ENV.POP || region.edges[0].pop;
const edges = region.edges.filter((e) => e.pop === POP);
if (edges.length === 0) {
  throw new Error(`POP=${POP}: no edges in ${REGION}`);
}
const CAPACITY = parseFloat(__ENV.CAPACITY || region.origin_capacity_rps || '0');
if (!(CAPACITY > 0)) {
  throw new Error(`set CAPACITY (requests/s the ${REGION} origin serves): the outputs carry no origin_capacity_rps`);
}
const FACTOR = parseFloat(__ENV.FACTOR || '3');
const DURATION = __ENV.DURATION || '2m';
// Shares of offered traffic per tier, lowest priority first.
const MIX = { test: 0.1, read: 0.5, write: 0.3, critical: 0.1 };
const TIERS = Object.keys(MIX);

const checker = eg.checker({ rulesFile: rulesPath(stack), settle: '7s' });
// Many uniform clients: the overload, not the rate limits, is under test.
const population = eg.population({ size: 50000, seed: 3, distribution: 'uniform', ipv6Share: 0.25, roamingShare: 0 });

const seconds = (name, def) => {
  const v = __ENV[name] || def;
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(v);
  if (!m || !(parseFloat(m[1]) > 0)) {
    throw new Error(`${name}=${v}: want a positive duration like 500ms, 5s or 2m`);
  }
  return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60 }[m[2]];
};
const TIMEOUT = seconds('REQUEST_TIMEOUT', '5s');
const LATENCY = { test: seconds('LATENCY', '1s'), critical: seconds('LATENCY_CRITICAL', '2s') };
LATENCY.read = LATENCY.write = LATENCY.test;

const scenarios = {};
for (const tier of TIERS) {
  const rate = Math.max(1, Math.round(CAPACITY * FACTOR * MIX[tier]));
  const preAllocatedVUs = Math.max(5, Math.ceil(rate * LATENCY[tier]));
  scenarios[`tier_${tier}`] = {
    executor: 'constant-arrival-rate',
    rate, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs, maxVUs: Math.max(preAllocatedVUs, Math.ceil(rate * (TIMEOUT + 0.1))),
    exec: 'traffic', env: { TIER: tier }, tags: { tier },
  };
}

const thresholds = Object.assign(correctnessThresholds(), {
  // Shedding answers 503 by design: judged per tier below, not overall.
  http_req_failed: [],
  'http_req_failed{tier:critical}': ['rate<0.001'],
  'http_req_failed{tier:write}': ['rate>=0'],
  'http_req_failed{tier:read}': ['rate>=0'],
  'http_req_failed{tier:test}': ['rate>=0'],
  'edgeguard_server{figure:lower_tiers_shed_first}': ['value==1'],
  // The run is an overload: the generator, which shares the cores, offered
  // at least 2x the capacity (dropped iterations are reported, not judged).
  http_reqs: [`rate>=${2 * CAPACITY}`],
});

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  teardownTimeout: '60s',
};

// The PoP's edges only: their counters are what the shares are taken from.
const popAdmins = edges.map((e) => `${e.admin}/metrics`);

export function setup() {
  eg.scrape('start', popAdmins);
  return { started: eg.now() };
}

// Each iteration is kept lean (no per-request bookkeeping beyond the
// checker): the generator shares two cores with the stack.
export function traffic() {
  const tier = __ENV.TIER;
  const edge = edges[Math.floor(Math.random() * edges.length)];
  send(checker, population.pick(), edge, {
    method: tier === 'write' ? 'POST' : 'GET',
    path: tier === 'write' ? '/orders' : '/catalog',
    headers: { 'X-Priority': tier },
    tags: { tier },
  });
}

// rejectedShares is, per tier, the share of the PoP's requests the edges
// turned away with 503 (ramp or worker cap), from their own counters:
// edgeguard_edge_requests_total{tier,outcome} between setup and teardown.
function rejectedShares(report) {
  const byTier = {};
  for (const [group, n] of Object.entries(report.deltas.requests_by_tier || {})) {
    const labels = Object.fromEntries(group.split(',').map((kv) => kv.split('=')));
    const t = (byTier[labels.tier] = byTier[labels.tier] || { all: 0, rejected: 0 });
    t.all += n;
    if (labels.outcome === 'shed' || labels.outcome === 'no_worker') {
      t.rejected += n;
    }
  }
  const out = {};
  for (const tier of TIERS) {
    out[tier] = byTier[tier] && byTier[tier].all > 0 ? byTier[tier].rejected / byTier[tier].all : 0;
  }
  return out;
}

export function teardown() {
  checker.finish();
  eg.scrape('end', popAdmins);
  const shed = rejectedShares(eg.serverDelta('start', 'end'));
  const tol = 0.01; // noise between two tiers that are both ~fully shed or ~untouched
  let ordered = shed.test > 0;
  for (let i = 1; i < TIERS.length; i++) {
    ordered = ordered && shed[TIERS[i - 1]] + tol >= shed[TIERS[i]];
  }
  eg.gauge('lower_tiers_shed_first', ordered ? 1 : 0);
  for (const tier of TIERS) {
    eg.gauge(`shed_share_${tier}`, shed[tier]);
  }
}

export function handleSummary(data) {
  const perTier = {};
  for (const tier of TIERS) {
    const m = data.metrics[`http_req_failed{tier:${tier}}`];
    perTier[tier] = m ? `${(100 * (1 - m.values.rate)).toFixed(3)}% success` : 'n/a';
  }
  const val = (name, field) => (data.metrics[name] ? data.metrics[name].values[field] : 0);
  return finish('overload', data, checker, {
    target: `${REGION}/${POP} (${edges.length} edge(s))`,
    capacity_rps: CAPACITY, planned_rps: CAPACITY * FACTOR, sent_rps: Math.round(val('http_reqs', 'rate')),
    dropped_iterations: val('dropped_iterations', 'count'), vus_max: val('vus_max', 'max'),
    tiers: perTier,
  });
}
