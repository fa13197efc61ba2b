// rls.js: Envoy's rate limit service on every edge of the stack, asked the
// way Envoy's global rate limit filter asks it (ShouldRateLimit over gRPC,
// eg.rls): one constant-arrival-rate scenario per region, each call for one
// client of a Zipf population (descriptor user) through one of the region's
// edges, so the hot clients run into the document's 10 per second.
//
//   make loadtest SCENARIO=rls [RATE=200] [DURATION=1m] [CLIENTS=500] [DOMAIN=stack] [REQUEST_TIMEOUT=5s]
//   SMOKE=1: 20 s, correctness thresholds only.
//
// setup pushes terraform/environments/local/rls/stack.yaml to every region
// with the stack's regionctl (PUSH=0 keeps the documents the regions have).
// Thresholds: no call failed (code ERROR: the service unavailable, a
// timeout), some calls answered OVER_LIMIT (the limits are enforced), and
// outside the smoke p99 below P99_MS (20 ms: Envoy's filter timeout).
import { check } from 'k6';
import eg from 'k6/x/edgeguard';
import { loadStack } from './lib/stack.js';

const stack = loadStack();
const SMOKE = __ENV.SMOKE === '1';
const RATE = parseInt(__ENV.RATE || (SMOKE ? '50' : '200'), 10); // calls/s per region
const DURATION = __ENV.DURATION || (SMOKE ? '20s' : '1m');
const P99_MS = parseFloat(__ENV.P99_MS || '20');
const DOMAIN = __ENV.DOMAIN || 'stack';
// A call's deadline: the generator shares the cores with the stack, so a
// slow answer is measured (the p99 threshold), not failed.
const TIMEOUT = __ENV.REQUEST_TIMEOUT || '5s';
const ROOT = __ENV.EDGEGUARD_ROOT || '.';

const population = eg.population({
  size: parseInt(__ENV.CLIENTS || '500', 10),
  seed: parseInt(__ENV.SEED || '1', 10),
  distribution: 'zipf', zipfS: 1.2,
});

const scenarios = {};
for (const region of stack.regionNames) {
  if (stack.regions[region].edges.some((e) => !e.rls)) {
    throw new Error(`region ${region}: an edge without a rate limit service address (rls) in the outputs`);
  }
  scenarios[`rls_${region.replace(/[^A-Za-z0-9_]/g, '_')}`] = {
    executor: 'constant-arrival-rate',
    rate: RATE, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs: Math.max(4, Math.ceil(RATE / 20)), maxVUs: Math.max(20, RATE),
    exec: 'ask',
    env: { HOME_REGION: region },
    tags: { home_region: region },
  };
}

const thresholds = {
  'edgeguard_rls_calls{code:ERROR}': ['count==0'],
  'edgeguard_rls_calls{code:OVER_LIMIT}': ['count>0'],
  'edgeguard_rls_calls{code:OK}': ['count>0'],
};
if (!SMOKE) {
  thresholds.edgeguard_rls_call_duration = [`p(99)<${P99_MS}`];
}

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  setupTimeout: '60s',
};

export function setup() {
  if (__ENV.PUSH === '0') {
    return {};
  }
  const regionctl = `${stack.stateDir}/bin/regionctl`;
  for (const name of stack.regionNames) {
    const r = eg.run(`rls_push_${name}`, [regionctl, '--consul', stack.regions[name].consul.http.replace(/^http:\/\//, ''),
      'rls', 'push', '--region', name, '--yes', '--message', 'loadtest rls', `${ROOT}/terraform/environments/local/rls/stack.yaml`]);
    if (r.code !== 0) {
      throw new Error(`regionctl rls push --region ${name} exited ${r.code}:\n${r.output}`);
    }
  }
  return {};
}

let next = 0;
let warned = false;

export function ask() {
  const region = stack.regions[__ENV.HOME_REGION];
  const edge = region.edges[next++ % region.edges.length];
  const client = population.pick();
  const res = eg.rls(edge.rls, { timeout: TIMEOUT }).shouldRateLimit({
    domain: DOMAIN,
    descriptors: [[{ key: 'user', value: String(client.id) }], [{ key: 'path', value: '/api' }]],
  });
  if (res.code === 'ERROR' && !warned) {
    warned = true;
    console.warn(`rate limit service of ${edge.name} (${edge.rls}): ${res.error}`);
  }
  check(res, {
    'answered OK or OVER_LIMIT': (r) => r.code === 'OK' || r.code === 'OVER_LIMIT',
    'one status per descriptor': (r) => r.code === 'ERROR' || r.statuses.length === 2,
  });
}
