// multi-region.js: one constant-arrival-rate scenario per region of the
// stack; clients reach their region's edges through DNS (the region's
// Consul DNS, edge.query.consul); a share of roaming clients also hit the
// other regions, and the checker judges them per region (regional counters).
// Beside it, per region, roaming API clients on GLOBAL_PATH (the stack's
// global rule roam-global, keyed on the API key): every client's requests
// land on both regions' edges, and the checker judges them against one
// quota over both regions.
//
//   make loadtest SCENARIO=multi-region [RATE=40] [DURATION=2m] [CLIENTS=500] [REQ_PATH=/drill/exact]
//                 [GLOBAL_RATE=15] [GLOBAL_PATH=/roam]
//   SMOKE=1: the CI smoke: 20 s, correctness thresholds only.
import { check } from 'k6';
import eg from 'k6/x/edgeguard';
import { adminURLs, correctnessThresholds, finish, homeOf, loadStack, pickClient, pickEdge, rulesPath, send } from './lib/stack.js';

const stack = loadStack();
const SMOKE = __ENV.SMOKE === '1';
const RATE = parseInt(__ENV.RATE || (SMOKE ? '25' : '40'), 10); // requests/s per region
const DURATION = __ENV.DURATION || (SMOKE ? '20s' : '2m');
const P99_MS = parseFloat(__ENV.P99_MS || '250');
// Where the traffic goes: by default the stack's exact rule (drill-exact,
// sliding_log 20 per client per 2 s), so Zipf's hot clients run into their
// limit and the checker has admissions and denials to judge.
const REQ_PATH = __ENV.REQ_PATH || '/drill/exact';
// The global rule's traffic (requests/s per region; 0 turns it off): with
// the population's Zipf the hottest client sends about a quarter of it,
// about 72 per 10 s at 15/s per region, well past roam-global's 40, and
// the next ones (about 32 and 20 per 10 s) near it or under it.
const GLOBAL_RATE = parseInt(__ENV.GLOBAL_RATE || '15', 10);
const GLOBAL_PATH = __ENV.GLOBAL_PATH || '/roam';

const checker = eg.checker({ rulesFile: rulesPath(stack), settle: '7s' });
const population = eg.population({
  size: parseInt(__ENV.CLIENTS || '500', 10),
  seed: parseInt(__ENV.SEED || '1', 10),
  distribution: 'zipf', zipfS: 1.2,
  ipv6Share: 0.25, roamingShare: 0.1,
});

const scenarios = {};
for (const region of stack.regionNames) {
  scenarios[`traffic_${region.replace(/[^A-Za-z0-9_]/g, '_')}`] = {
    executor: 'constant-arrival-rate',
    rate: RATE, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs: Math.max(4, Math.ceil(RATE / 4)), maxVUs: Math.max(20, RATE * 2),
    exec: 'traffic',
    env: { HOME_REGION: region },
    tags: { home_region: region },
  };
  if (GLOBAL_RATE > 0) {
    scenarios[`global_${region.replace(/[^A-Za-z0-9_]/g, '_')}`] = {
      executor: 'constant-arrival-rate',
      rate: GLOBAL_RATE, timeUnit: '1s', duration: DURATION,
      preAllocatedVUs: Math.max(2, Math.ceil(GLOBAL_RATE / 4)), maxVUs: Math.max(10, GLOBAL_RATE * 2),
      exec: 'roaming',
      env: { HOME_REGION: region },
      tags: { home_region: region },
    };
  }
}

const thresholds = correctnessThresholds();
if (!SMOKE) {
  // Latency only outside CI: a shared 2-core runner says nothing absolute.
  thresholds['http_req_duration{expected_response:true}'] = [`p(99)<${P99_MS}`];
}

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  setupTimeout: '30s',
  teardownTimeout: '60s',
};

export function setup() {
  eg.scrape('start', adminURLs(stack));
  return { started: eg.now() };
}

export function traffic() {
  const region = __ENV.HOME_REGION;
  const client = pickClient(stack, population, region);
  const edge = pickEdge(stack, region);
  if (!edge) {
    check(null, { 'DNS answered an edge': () => false });
    return;
  }
  const roaming = client.roaming && homeOf(stack, client) !== region;
  const res = send(checker, client, edge, { path: REQ_PATH, tags: { roaming: String(roaming) } });
  check(res, {
    'answered 2xx or 429': (r) => (r.status >= 200 && r.status < 300) || r.status === 429,
    'RateLimit fields present': (r) => r.status >= 500 || !!(r.headers['Ratelimit-Policy'] || r.headers['RateLimit-Policy']),
  });
}

// roaming: one request of a client drawn from the whole population (its
// other requests go to the other regions' scenarios) on the global rule.
export function roaming() {
  const region = __ENV.HOME_REGION;
  const client = population.pick();
  const edge = pickEdge(stack, region);
  if (!edge) {
    check(null, { 'DNS answered an edge': () => false });
    return;
  }
  const res = send(checker, client, edge, { path: GLOBAL_PATH, tags: { roaming: 'global' }, checkTags: { rule: 'global' } });
  check(res, {
    'answered 2xx or 429': (r) => (r.status >= 200 && r.status < 300) || r.status === 429,
    'RateLimit fields present': (r) => r.status >= 500 || !!(r.headers['Ratelimit-Policy'] || r.headers['RateLimit-Policy']),
  });
}

export function teardown() {
  checker.finish();
  eg.scrape('end', adminURLs(stack));
  eg.serverDelta('start', 'end');
}

export function handleSummary(data) {
  const routing = {};
  for (const name of stack.regionNames) {
    const r = stack.regions[name];
    routing[name] = stack.useDNS && r.consul && r.consul.dns ? `DNS ${stack.dnsQuery}.query.consul at ${r.consul.dns}` : `outputs (${r.edges.length} edges)`;
  }
  return finish(SMOKE ? 'multi-region-smoke' : 'multi-region', data, checker, { routing, rate_per_region: RATE, global_rate_per_region: GLOBAL_RATE });
}
