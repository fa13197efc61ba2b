// shed-bench.js: one region's edges against a 3x step overload and an
// origin whose capacity halves mid-run, with the shedder in one MODE:
//
//   today     the utilization ramp and the worker cap at the region's
//             settings (adaptive.enabled=false)
//   adaptive  the same plus the adaptive origin limit (adaptive.enabled=true)
//
//   make shed-bench                          # both modes, alternated, ROUNDS times; prints the table
//   loadtest/run.sh shed-bench -e MODE=adaptive [-e REGION=us-east] [-e FACTOR=3] ...
//
// Phases (seconds from the start): UNLOADED (15 s) at UNLOADED_FACTOR (0.5)
// x the origin's capacity, which measures the unloaded p99; then FACTOR (3)
// x that capacity for STEP (30 s), after which the stack origin's workers
// are halved (PUT /capacity) for HALVED (30 s) more at the same offered
// rate. Setup sets MODE with regionctl and waits until every edge of the
// region reports it; teardown gives the origin its capacity back.
//
// Figures, per 1 s window (a sampler VU scrapes the origin and the edges):
// goodput (requests the origin served per second, its own counter) against
// the origin's capacity at the time, and the edges' rejection ratio (shed,
// no worker or abandoned, over all their requests). Per 10 s window: mean
// goodput / capacity, and the rejection ratio's mean and standard deviation
// over its ten 1 s windows. Per phase: p99 of admitted requests (200s) after
// the first 5 s, as k6 and as the edges measured it, against the unloaded
// p99; critical requests lost (anything but a 200) and refused by the
// edges; the seconds from the step (and from the halving) to the first 1 s
// window with goodput >= 90% of capacity, and the share of windows from 5 s
// on at >= 90%. The figures go to shed-bench-RUN-figures.json and are
// printed; thresholds judge only what must hold in every mode: no critical
// request lost, and the edges reported MODE. SCALE (1) runs the origin at
// that share of its workers, SLOWDOWN (1) at that multiple of its service
// time (SCALE=0.5 SLOWDOWN=2: 4 workers x 40 ms, 100 req/s, so 3x is 300
// req/s: what one k6 keeps up with on two shared cores).
//
// The generator: REQUEST_TIMEOUT (2s) bounds a request, and a request cut
// short by it counts as lost (not admitted); every arrival has a VU
// initialized before the start (VU_SECONDS, the timeout plus 0.5 s, x the
// rate), so an arrival finds no VU free only when requests pile up past the
// timeout, and k6 counts it as a dropped iteration. Response bodies are
// discarded. Every request that is not a 200 is counted by tier and cause:
// timeout (k6's own), k6 (another client error: connection refused,
// reset), refused (a 503 with EdgeGuard-Not-Processed: the edge turned it
// away before the origin), origin (a 5xx without it: the origin or the
// proxy failed), other (any other status).
import http from 'k6/http';
import { sleep } from 'k6';
import { Counter } from 'k6/metrics';
import eg from 'k6/x/edgeguard';
import { loadStack } from './lib/stack.js';

const stack = loadStack();
const REGION = __ENV.REGION || (stack.regions['us-east'] ? 'us-east' : stack.regionNames[0]);
const region = stack.regions[REGION];
if (!region) {
  throw new Error(`REGION=${REGION}: not in the stack (have ${stack.regionNames.join(', ')})`);
}
const MODE = __ENV.MODE || 'today';
if (MODE !== 'today' && MODE !== 'adaptive') {
  throw new Error(`MODE=${MODE}: want today or adaptive`);
}
const edges = region.edges;
const ORIGIN = region.origin;
const FULL_CAPACITY = parseFloat(region.origin_capacity_rps || '0');
if (!ORIGIN || !(FULL_CAPACITY > 0)) {
  throw new Error(`the outputs give ${REGION} no origin or origin_capacity_rps`);
}
const num = (name, def) => {
  const v = parseFloat(__ENV[name] || def);
  if (!(v > 0)) {
    throw new Error(`${name}=${__ENV[name]}: want a positive number`);
  }
  return v;
};
// SCALE runs the origin at that share of its workers and SLOWDOWN at that
// multiple of its service time (the generator shares the cores with the
// stack: 0.5 and 2 send a quarter as much).
const SCALE = num('SCALE', '1');
const SLOWDOWN = num('SLOWDOWN', '1');
const CAPACITY = (FULL_CAPACITY * SCALE) / SLOWDOWN;
const FACTOR = num('FACTOR', '3');
const UNLOADED_FACTOR = num('UNLOADED_FACTOR', '0.5');
const UNLOADED = num('UNLOADED', '15');
const STEP = num('STEP', '30');
const HALVED = num('HALVED', '30');
const SETTLE = 5; // seconds after a change before the p99 and the share of good windows count
const TOTAL = UNLOADED + STEP + HALVED;
const TIMEOUT = __ENV.REQUEST_TIMEOUT || '2s';
const TIMEOUT_S = (() => {
  const m = /^(\d+(?:\.\d+)?)(ms|s)$/.exec(TIMEOUT);
  if (!m) {
    throw new Error(`REQUEST_TIMEOUT=${TIMEOUT}: want a duration like 2s or 1500ms`);
  }
  return parseFloat(m[1]) / (m[2] === 'ms' ? 1000 : 1);
})();
const CAUSES = ['timeout', 'k6', 'refused', 'origin', 'other'];
// SETTINGS: more shedder settings (key=value, space-separated) that setup
// pushes with the mode, the same in both modes.
const SETTINGS = (__ENV.SETTINGS || '').split(/\s+/).filter((kv) => kv !== '');
const MIX = { test: 0.1, read: 0.5, write: 0.3, critical: 0.1 };
const TIERS = Object.keys(MIX);
// RUN names this run's two result files: shed-bench-RUN-figures.json (the
// sampler's figures) and shed-bench-RUN-k6.json (k6's own counts).
const RUN = __ENV.RUN || `${MODE}-${Date.now()}`;

// regionctl of the stack (its state directory's bin/), or REGIONCTL.
const rawOutputs = JSON.parse(open(__ENV.STACK_OUTPUTS));
const unwrap = (v) => (v && typeof v === 'object' && 'value' in v ? v.value : v);
const REGIONCTL = __ENV.REGIONCTL || `${unwrap(rawOutputs.state_dir)}/bin/regionctl`;

const population = eg.population({ size: 50000, seed: 5, distribution: 'uniform', ipv6Share: 0.25, roamingShare: 0 });
const criticalLost = new Counter('shed_bench_critical_lost');
const notOK = new Counter('shed_bench_not_ok');

// Every VU is initialized before the start (VU_SECONDS, the timeout plus
// 0.5 s, x the rate: enough for every request to run into its timeout): a
// k6 initializing VUs mid-run on two loaded cores stops sending while it
// does. An arrival with no VU free is a dropped iteration, reported with
// the figures.
const VU_SECONDS = num('VU_SECONDS', String(TIMEOUT_S + 0.5));
const scenarios = {};
for (const tier of TIERS) {
  for (const [phase, factor, start, duration] of [['unloaded', UNLOADED_FACTOR, 0, UNLOADED], ['overload', FACTOR, UNLOADED, STEP + HALVED]]) {
    const rate = Math.max(1, Math.round(CAPACITY * factor * MIX[tier]));
    const vus = Math.max(5, Math.ceil(rate * VU_SECONDS));
    scenarios[`${phase}_${tier}`] = {
      executor: 'constant-arrival-rate',
      rate, timeUnit: '1s', startTime: `${start}s`, duration: `${duration}s`,
      preAllocatedVUs: vus, maxVUs: vus,
      exec: 'traffic', env: { TIER: tier }, tags: { tier },
    };
  }
}
scenarios.sampler = {
  executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${TOTAL + 60}s`, exec: 'sample',
};

const thresholds = {
  shed_bench_critical_lost: ['count==0'],
  'edgeguard_server{figure:mode_applied}': ['value==1'],
  'http_req_failed{tier:critical}': ['rate>=0'],
};
// Always true: they make k6 keep each tier's and cause's count for the summary.
for (const tier of TIERS) {
  for (const cause of CAUSES) {
    thresholds[`shed_bench_not_ok{tier:${tier},cause:${cause}}`] = ['count>=0'];
  }
}

export const options = {
  scenarios,
  thresholds,
  discardResponseBodies: true,
  // Fewer tags on k6's own samples: less work per request for a generator
  // that shares two cores with the stack.
  systemTags: ['status', 'method', 'name', 'scenario', 'error_code', 'expected_response'],
  summaryTrendStats: ['avg', 'med', 'p(99)', 'max'],
  setupTimeout: '60s',
  teardownTimeout: '30s',
};

// One edge metric family's samples, label set → value.
function samples(text, name) {
  const out = {};
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') || line.startsWith(name + ' ')) {
      const i = line.lastIndexOf(' ');
      out[line.slice(name.length, i)] = parseFloat(line.slice(i + 1));
    }
  }
  return out;
}

function getText(url) {
  const res = http.get(url, { tags: { name: 'scrape' }, timeout: '3s', responseType: 'text', responseCallback: http.expectedStatuses(200) });
  if (res.status !== 200) {
    throw new Error(`GET ${url}: ${res.status} ${res.error || ''}`);
  }
  return res.body;
}

function capacity() {
  return JSON.parse(getText(`${ORIGIN}/capacity`));
}

export function setup() {
  const cap = capacity();
  if (Math.abs(cap.capacity_rps - FULL_CAPACITY) > 0.01 * FULL_CAPACITY) {
    throw new Error(`the ${REGION} origin serves ${cap.capacity_rps} req/s, the outputs say ${FULL_CAPACITY}: a run ended early? ` +
      `give it back: curl -X PUT -d '{"workers": N}' ${ORIGIN}/capacity`);
  }
  const workers = Math.round(cap.workers * SCALE);
  if (workers < 2 || Math.abs(workers / cap.workers - SCALE) > 1e-9) {
    throw new Error(`SCALE=${SCALE}: the origin's ${cap.workers} workers scale to ${cap.workers * SCALE}, want a whole number ≥ 2`);
  }
  const service = `${(parseDuration(cap.service_time) * SLOWDOWN * 1000).toFixed(3)}ms`;
  setCapacity({ workers, service_time: service });
  const consul = region.consul.http.replace(/^https?:\/\//, '');
  const r = eg.run('mode', [REGIONCTL, '--consul', consul, 'shedder', 'set', '--region', REGION, ...SETTINGS, `adaptive.enabled=${MODE === 'adaptive'}`]);
  if (r.code !== 0) {
    throw new Error(`regionctl shedder set: exit ${r.code}: ${r.output}`);
  }
  // The edges apply it from their Consul watch: wait until each reports it.
  const want = MODE === 'adaptive' ? 1 : 0;
  let applied = false;
  for (let i = 0; i < 150 && !applied; i++) {
    applied = edges.every((e) => samples(getText(`${e.admin}/metrics`), 'edgeguard_shedder_adaptive_enabled')[''] === want);
    if (!applied) {
      sleep(0.2);
    }
  }
  eg.gauge('mode_applied', applied ? 1 : 0);
  if (!applied) {
    throw new Error(`the edges of ${REGION} did not report adaptive.enabled=${MODE === 'adaptive'} within 30 s`);
  }
  return { original: cap.workers, originalService: cap.service_time, workers };
}

// parseDuration reads a Go duration of one unit (the origin's 20ms), in s.
function parseDuration(d) {
  const m = /^(\d+(?:\.\d+)?)(ns|µs|us|ms|s)$/.exec(d);
  if (!m) {
    throw new Error(`the origin's service time ${d}: not a duration of one unit`);
  }
  return parseFloat(m[1]) * { ns: 1e-9, µs: 1e-6, us: 1e-6, ms: 1e-3, s: 1 }[m[2]];
}

function setCapacity(c) {
  const res = http.put(`${ORIGIN}/capacity`, JSON.stringify(c), { tags: { name: 'capacity' }, responseType: 'text' });
  if (res.status !== 200) {
    throw new Error(`setting the origin's capacity to ${JSON.stringify(c)}: ${res.status} ${res.body}`);
  }
}

function setWorkers(n) {
  setCapacity({ workers: n });
}

export function traffic() {
  const tier = __ENV.TIER;
  const edge = edges[Math.floor(Math.random() * edges.length)];
  const write = tier === 'write';
  const client = population.pick();
  const res = http.request(write ? 'POST' : 'GET', `${edge.url}${write ? '/orders' : '/catalog'}`, null, {
    headers: Object.assign({ 'X-Priority': tier }, client.headers),
    tags: { tier, name: write ? '/orders' : '/catalog' },
    timeout: TIMEOUT,
  });
  if (res.status === 200) {
    eg.observe('admitted_ms', res.timings.duration);
    return;
  }
  if (tier === 'critical') {
    criticalLost.add(1);
  }
  notOK.add(1, { tier, cause: cause(res) });
}

// cause names why a request got no 200 (see the head of this file).
function cause(res) {
  if (res.status === 0) {
    return res.error_code === 1050 ? 'timeout' : 'k6';
  }
  if (res.status === 503 && res.headers['Edgeguard-Not-Processed']) {
    return 'refused';
  }
  return res.status >= 500 ? 'origin' : 'other';
}

// The edges' requests: all, those they turned away before the origin, and
// the proxied ones' duration histogram (upper bound → cumulative count),
// summed over the edges; t is the middle of the scrapes.
function edgeCounts() {
  let all = 0;
  let rejected = 0;
  let criticalRejected = 0;
  const buckets = {};
  const t0 = eg.now();
  for (const e of edges) {
    const text = getText(`${e.admin}/metrics`);
    for (const [labels, v] of Object.entries(samples(text, 'edgeguard_edge_requests_total'))) {
      all += v;
      if (/outcome="(shed|no_worker|abandoned)"/.test(labels)) {
        rejected += v;
        if (labels.includes('tier="critical"')) {
          criticalRejected += v;
        }
      }
    }
    for (const [labels, v] of Object.entries(samples(text, 'edgeguard_edge_request_duration_seconds_bucket'))) {
      const m = /outcome="proxied",le="([^"]+)"/.exec(labels);
      if (m) {
        buckets[m[1]] = (buckets[m[1]] || 0) + v;
      }
    }
  }
  return { t: (t0 + eg.now()) / 2, all, rejected, criticalRejected, buckets };
}

function originServed() {
  const t0 = eg.now();
  const served = samples(getText(`${ORIGIN}/metrics`), 'edgeguard_originsim_requests_total')['{outcome="served"}'] || 0;
  return { t: (t0 + eg.now()) / 2, served };
}

// histogramQuantile is the q-quantile of the requests between two bucket
// snapshots, interpolated linearly inside its bucket (as Prometheus does),
// in ms; null without requests.
function histogramQuantile(q, from, to) {
  const les = Object.keys(to).filter((le) => le !== '+Inf').map(parseFloat).sort((a, b) => a - b);
  const n = (le) => (to[String(le)] || 0) - ((from && from[String(le)]) || 0);
  const total = (to['+Inf'] || 0) - ((from && from['+Inf']) || 0);
  if (!(total > 0)) {
    return null;
  }
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const le of les) {
    const c = n(le);
    if (c >= rank) {
      return 1000 * (lower + ((le - lower) * (rank - below)) / Math.max(c - below, 1));
    }
    lower = le;
    below = c;
  }
  return 1000 * lower; // in +Inf: the largest finite bound
}

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
const stddev = (xs) => {
  const m = mean(xs);
  return xs.length ? Math.sqrt(xs.reduce((a, x) => a + (x - m) * (x - m), 0) / xs.length) : null;
};

// sample runs once for the whole test: a 1 s window at a time, the halving
// at UNLOADED + STEP, then the figures.
export function sample(data) {
  const start = eg.mark('start');
  const windows = [];
  // A scrape the loaded machine did not answer in time leaves its window
  // out (counted as missed); the next window spans the gap.
  const read = () => {
    try {
      return { origin: originServed(), edge: edgeCounts() };
    } catch (e) {
      return null;
    }
  };
  let missed = 0;
  let prev = read();
  const first = prev;
  const snapshots = { 0: prev ? prev.edge.buckets : null };
  let halvedAt = 0;
  for (let k = 1; k <= TOTAL; k++) {
    const wait = (start + k * 1000 - eg.now()) / 1000;
    if (wait > 0) {
      sleep(wait);
    }
    // A sampler stalled past the next window (k6 starved of CPU) skips
    // this one, so the next window spans the stall, instead of reading
    // back to back and recording windows a few ms long in which nothing
    // moved.
    const late = k < TOTAL && eg.now() > start + (k + 1) * 1000;
    const cur = late ? null : read();
    if (k === UNLOADED + STEP) {
      setWorkers(Math.floor(data.workers / 2));
      halvedAt = eg.mark('halve');
    }
    if (!cur || !prev) {
      missed++;
      prev = prev || cur;
      continue;
    }
    const all = cur.edge.all - prev.edge.all;
    snapshots[k] = cur.edge.buckets;
    windows.push({
      t: k,
      goodput: (cur.origin.served - prev.origin.served) / ((cur.origin.t - prev.origin.t) / 1000),
      capacity: k > UNLOADED + STEP ? CAPACITY * Math.floor(data.workers / 2) / data.workers : CAPACITY,
      offered: all / ((cur.edge.t - prev.edge.t) / 1000),
      rejection: all > 0 ? (cur.edge.rejected - prev.edge.rejected) / all : 0,
    });
    prev = cur;
  }
  // Critical requests the edges turned away (k6's count of lost ones also
  // holds those its own timeouts cut short).
  const criticalRefused = first && prev ? prev.edge.criticalRejected - first.edge.criticalRejected : null;
  figures(start, windows, halvedAt, missed, snapshots, criticalRefused);
}

// phase summarises the 1 s windows (t in (from, to]) of one phase.
function phase(windows, from, to) {
  const ws = windows.filter((w) => w.t > from && w.t <= to);
  const first = ws.find((w) => w.goodput >= 0.9 * w.capacity);
  const settled = ws.filter((w) => w.t > from + SETTLE);
  return {
    seconds_to_90: first ? first.t - from : null,
    good_windows_after_5s: settled.length ? settled.filter((w) => w.goodput >= 0.9 * w.capacity).length / settled.length : null,
    goodput_ratio_after_5s: mean(settled.map((w) => w.goodput / w.capacity)),
    rejection_mean_after_5s: mean(settled.map((w) => w.rejection)),
    // What reached the edges (req/s): the generator, short of VUs or CPU,
    // may have sent less than planned.
    offered_after_5s: mean(settled.map((w) => w.offered)),
  };
}

function figures(start, windows, halvedAt, missed, snapshots, criticalRefused) {
  const s = (sec) => start + sec * 1000;
  const p99 = (from, to) => eg.quantile('admitted_ms', 0.99, from, to);
  const unloadedP99 = p99(s(SETTLE), s(UNLOADED));
  const stepP99 = p99(s(UNLOADED + SETTLE), halvedAt);
  const halvedP99 = p99(halvedAt + SETTLE * 1000, 0);
  // The edges' own p99 of proxied requests, between two windows' snapshots
  // (the nearest taken at or after each): the generator, on the same loaded
  // cores, adds its own delays to what k6 measures.
  const snap = (k) => {
    for (let i = k; i <= TOTAL; i++) {
      if (snapshots[i]) {
        return snapshots[i];
      }
    }
    return null;
  };
  const edgeP99 = (a, b) => {
    const from = snap(a);
    const to = snap(b);
    return from && to ? histogramQuantile(0.99, from, to) : null;
  };
  const edgeUnloaded = edgeP99(SETTLE, UNLOADED);
  const edgeStep = edgeP99(UNLOADED + SETTLE, UNLOADED + STEP);
  const edgeHalved = edgeP99(UNLOADED + STEP + SETTLE, TOTAL);
  const tens = [];
  for (let from = 0; from < TOTAL; from += 10) {
    const ws = windows.filter((w) => w.t > from && w.t <= from + 10);
    tens.push({
      from, to: from + ws.length,
      goodput_ratio: mean(ws.map((w) => w.goodput / w.capacity)),
      rejection_mean: mean(ws.map((w) => w.rejection)),
      rejection_stddev: stddev(ws.map((w) => w.rejection)),
    });
  }
  const out = {
    mode: MODE,
    region: REGION,
    capacity_rps: CAPACITY,
    windows_missed: missed,
    critical_refused_by_edges: criticalRefused,
    unloaded_p99_ms: unloadedP99,
    edge_unloaded_p99_ms: edgeUnloaded,
    step: Object.assign(phase(windows, UNLOADED, UNLOADED + STEP), {
      admitted_p99_ms: stepP99, p99_ratio: unloadedP99 ? stepP99 / unloadedP99 : null,
      edge_p99_ms: edgeStep, edge_p99_ratio: edgeUnloaded ? edgeStep / edgeUnloaded : null,
    }),
    halved: Object.assign(phase(windows, UNLOADED + STEP, TOTAL), {
      admitted_p99_ms: halvedP99, p99_ratio: unloadedP99 ? halvedP99 / unloadedP99 : null,
      edge_p99_ms: edgeHalved, edge_p99_ratio: edgeUnloaded ? edgeHalved / edgeUnloaded : null,
    }),
    // The overload's 10 s windows (after the first, which holds the step).
    rejection_stddev_10s_max: Math.max(...tens.filter((w) => w.from >= UNLOADED + 10).map((w) => w.rejection_stddev)),
    windows_10s: tens,
    windows_1s: windows,
  };
  eg.writeResult(`shed-bench-${RUN}-figures.json`, JSON.stringify(out, null, 1));
  eg.print(render(out));
}

const f = (v, d) => (v === null || v === undefined || Number.isNaN(v) ? '-' : v.toFixed(d));
const pct = (v) => (v === null || v === undefined ? '-' : `${(100 * v).toFixed(0)}%`);

function render(o) {
  const lines = [
    '',
    `shed-bench ${o.mode}: ${o.region}, origin ${o.capacity_rps} req/s, ${FACTOR}x from ${UNLOADED} s, workers halved at ${UNLOADED + STEP} s; unloaded p99 ${f(o.unloaded_p99_ms, 1)} ms (k6), ${f(o.edge_unloaded_p99_ms, 1)} ms (edges)`,
    '  1 s windows: t goodput/capacity rejection',
    '  ' + o.windows_1s.map((w) => `${w.t}:${pct(w.goodput / w.capacity)}/${f(w.rejection, 2)}`).join(' '),
    '  10 s windows: from-to goodput/capacity rejection mean ± stddev',
  ];
  for (const w of o.windows_10s) {
    lines.push(`    ${w.from}-${w.to} s  ${pct(w.goodput_ratio)}  ${f(w.rejection_mean, 3)} ± ${f(w.rejection_stddev, 3)}`);
  }
  for (const k of ['step', 'halved']) {
    const p = o[k];
    lines.push(`  ${k}: to goodput >= 90%: ${p.seconds_to_90 === null ? 'never' : p.seconds_to_90 + ' s'}; from 5 s on: goodput ${pct(p.goodput_ratio_after_5s)} of capacity, ` +
      `${pct(p.good_windows_after_5s)} of windows >= 90%, offered ${f(p.offered_after_5s, 0)} req/s, rejection ${f(p.rejection_mean_after_5s, 3)}; admitted p99 ${f(p.admitted_p99_ms, 1)} ms (${f(p.p99_ratio, 2)}x unloaded; k6), ` +
      `${f(p.edge_p99_ms, 1)} ms (${f(p.edge_p99_ratio, 2)}x; edges)`);
  }
  lines.push(`  critical requests the edges refused: ${o.critical_refused_by_edges}`);
  lines.push(`  rejection ratio stddev, largest over the overload's 10 s windows: ${f(o.rejection_stddev_10s_max, 3)}`);
  return lines.join('\n');
}

export function teardown(data) {
  setCapacity({ workers: data.original, service_time: data.originalService });
}

export function handleSummary(data) {
  const m = (name, field) => (data.metrics[name] ? data.metrics[name].values[field] : 0);
  const crit = data.metrics['http_req_failed{tier:critical}'];
  const counts = {
    mode: MODE,
    requests: m('http_reqs', 'count'),
    requests_per_s: m('http_reqs', 'rate'),
    dropped_iterations: m('dropped_iterations', 'count'),
    critical_lost: m('shed_bench_critical_lost', 'count'),
    critical_sent: crit ? crit.values.passes + crit.values.fails : 0,
    // Requests without a 200, by tier and cause.
    not_ok: Object.fromEntries(TIERS.map((tier) => [tier, Object.fromEntries(CAUSES.map((c) => [c, m(`shed_bench_not_ok{tier:${tier},cause:${c}}`, 'count') || 0]))])),
    vus_max: m('vus_max', 'max'),
    mode_applied: m('edgeguard_server{figure:mode_applied}', 'value') === 1,
  };
  eg.writeResult(`shed-bench-${RUN}-k6.json`, JSON.stringify(counts, null, 1));
  eg.print(`shed-bench ${MODE}: ${counts.requests} requests (${f(counts.requests_per_s, 0)}/s), ` +
    `dropped iterations ${counts.dropped_iterations}, critical lost ${counts.critical_lost} of ${counts.critical_sent}; ` +
    `not a 200, by tier and cause: ${JSON.stringify(counts.not_ok)}`);
  // The figures above stand for k6's own summary (a failed threshold still
  // fails the run).
  return {};
}
