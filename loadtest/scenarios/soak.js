// soak.js: 30 minutes of steady multi-region traffic (not in CI). Every
// SAMPLE_EVERY it reads each edge's resident memory from its admin
// /metrics; at the end it judges the growth after WARMUP (least squares,
// per edge; the worst edge counts) and the p99 of the last 5 minutes
// against the first 5.
//
//   make loadtest SCENARIO=soak [DURATION=30m] [RATE=30] [WARMUP=5m]
//
// Thresholds (besides the correctness ones): RSS growth <= 1 MB/min after
// warm-up; p99(last 5 min) <= 1.5 x p99(first 5 min).
import { check, sleep } from 'k6';
import eg from 'k6/x/edgeguard';
import { adminURLs, correctnessThresholds, finish, loadStack, pickClient, pickEdge, rulesPath, send } from './lib/stack.js';

const stack = loadStack();
const RATE = parseInt(__ENV.RATE || '30', 10);
const DURATION = __ENV.DURATION || '30m';
const minutes = (d) => {
  const m = /^(\d+(?:\.\d+)?)(s|m|h)$/.exec(d);
  if (!m) {
    throw new Error(`${d}: want a duration like 90s, 30m or 1h`);
  }
  return parseFloat(m[1]) * { s: 1 / 60, m: 1, h: 60 }[m[2]];
};
const WARMUP_MIN = minutes(__ENV.WARMUP || '5m');
const SLICE_MIN = Math.min(5, minutes(DURATION) / 3); // "first/last 5 minutes", shorter for short trial runs
const SAMPLE_EVERY = parseFloat(__ENV.SAMPLE_EVERY || '15'); // seconds

const checker = eg.checker({ rulesFile: rulesPath(stack), settle: '7s' });
const population = eg.population({
  size: parseInt(__ENV.CLIENTS || '5000', 10), seed: 4,
  distribution: 'zipf', zipfS: 1.1, ipv6Share: 0.25, roamingShare: 0.1,
});

const scenarios = {
  rss: { executor: 'constant-vus', vus: 1, duration: DURATION, exec: 'sampleRSS' },
};
for (const region of stack.regionNames) {
  scenarios[`traffic_${region.replace(/[^A-Za-z0-9_]/g, '_')}`] = {
    executor: 'constant-arrival-rate', rate: RATE, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs: Math.max(4, Math.ceil(RATE / 4)), maxVUs: Math.max(20, RATE * 2),
    exec: 'traffic', env: { HOME_REGION: region }, tags: { home_region: region },
  };
}

export const options = {
  scenarios,
  thresholds: Object.assign(correctnessThresholds(), {
    'edgeguard_server{figure:rss_growth_bytes_per_min}': ['value<=1048576'],
    'edgeguard_server{figure:p99_last_over_first}': ['value<=1.5'],
    // Listed so the summary shows them (k6 keeps only submetrics that a
    // threshold names).
    'edgeguard_server{figure:p99_first_ms}': ['value>=0'],
    'edgeguard_server{figure:p99_last_ms}': ['value>=0'],
  }),
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  teardownTimeout: '120s',
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
  const res = send(checker, client, edge, { path: __ENV.REQ_PATH || '/drill/exact' });
  if (res.status !== 0 && res.status < 500) {
    eg.observe('latency', res.timings.duration);
  }
  check(res, { 'answered 2xx or 429': (r) => (r.status >= 200 && r.status < 300) || r.status === 429 });
}

export function sampleRSS() {
  const values = eg.scrapeValues(adminURLs(stack), 'process_resident_memory_bytes');
  for (const [url, v] of Object.entries(values)) {
    eg.observe(`rss ${url}`, v);
  }
  sleep(SAMPLE_EVERY);
}

// A figure that could not be computed fails its threshold, loudly.
const MISSING = 1e12;

export function teardown(data) {
  checker.finish();
  const end = eg.now();
  let worst = null;
  const growth = {};
  for (const url of adminURLs(stack)) {
    const g = eg.slope(`rss ${url}`, data.started + WARMUP_MIN * 60000, end);
    growth[url] = g;
    if (g !== null && (worst === null || g > worst)) {
      worst = g;
    }
  }
  const first = eg.quantile('latency', 0.99, data.started, data.started + SLICE_MIN * 60000);
  const last = eg.quantile('latency', 0.99, end - SLICE_MIN * 60000, end);
  if (worst === null) {
    console.error(`soak: fewer than two RSS samples after the ${WARMUP_MIN} min warm-up: run longer than WARMUP`);
  }
  if (first === null || last === null) {
    console.error('soak: no latency samples in the first or last slice');
  }
  eg.gauge('rss_growth_bytes_per_min', worst === null ? MISSING : worst);
  eg.gauge('p99_last_over_first', first && last !== null ? last / first : MISSING);
  eg.gauge('p99_first_ms', first === null ? MISSING : first);
  eg.gauge('p99_last_ms', last === null ? MISSING : last);
  eg.scrape('end', adminURLs(stack));
  eg.serverDelta('start', 'end');
  return { growth, first, last };
}

export function handleSummary(data) {
  const g = (f) => {
    const m = data.metrics[`edgeguard_server{figure:${f}}`];
    return m ? m.values.value : null;
  };
  return finish('soak', data, checker, {
    duration: DURATION, warmup_min: WARMUP_MIN, slice_min: SLICE_MIN,
    rss_growth_bytes_per_min_worst_edge: g('rss_growth_bytes_per_min'),
    p99_first_ms: g('p99_first_ms'), p99_last_ms: g('p99_last_ms'), p99_last_over_first: g('p99_last_over_first'),
  });
}
