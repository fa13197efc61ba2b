// failover.js: steady multi-region traffic while a drill runs at a marked
// time, then is undone. By default the drill is the stack's own tooling
// (cmd/drills, built by make loadtest, reading the same outputs): it kills
// the Redis master of the Sentinel region (DRILL=kill-master, or
// DRILL_REGION=eu-west for the Cluster's) and waits for its replacement, or
// drains a region (DRILL=drain DRILL_REGION=eu-west: every edge SIGTERMed,
// clients follow DNS elsewhere); RECOVER_AFTER later it brings back what
// was stopped (cmd/drills restore; RECOVER=none skips it). DRILL_CMD and
// RECOVER_CMD (shell commands) override both. The scenario runs the
// commands and records their timestamps (and the drill's own witness: when
// the replica was promoted, when the edges reported draining), then splits
// errors and checker findings before / during / after.
//
//   make loadtest SCENARIO=failover [DRILL=kill-master|drain] [DRILL_REGION=…] [RECOVER=restore|none] \
//        [DRILL_AT=20s] [RECOVER_AFTER=15s] [DURING=15s] [DURATION=75s] [RATE=30] [SETTLE_TIMEOUT=3m]
//   make loadtest SCENARIO=failover DRILL_CMD='…' [RECOVER_CMD='…']
//
// "during" runs from the drill's start to the end of the recovery, or, with
// none, to DURING after the drill command returned (a Redis failover the
// stack heals by itself). Thresholds hold before and after; during is
// reported (the fallback is approximate by design). Setup first waits (up to
// SETTLE_TIMEOUT) until no edge is still shedding from an earlier overload.
import { check, sleep } from 'k6';
import eg from 'k6/x/edgeguard';
import { adminURLs, finish, loadStack, pickClient, pickEdge, rulesPath, send } from './lib/stack.js';

const stack = loadStack();
const RATE = parseInt(__ENV.RATE || '30', 10);
// The stack's exact rule by default (sliding_log 20 per client per 2 s), so
// over-admission during the failover has decisions to be judged on.
const REQ_PATH = __ENV.REQ_PATH || '/drill/exact';
const DURATION = __ENV.DURATION || '75s';
// The drill and its recovery as argv: the stack's tooling unless a shell
// command overrides it.
const DRILL = __ENV.DRILL || 'kill-master';
const DRILL_REGION = __ENV.DRILL_REGION || '';
const RECOVER = __ENV.RECOVER || 'restore';
const drillsTool = (args) => {
  const bin = __ENV.EDGEGUARD_DRILLS;
  if (!bin) {
    throw new Error('EDGEGUARD_DRILLS is not set (make loadtest builds cmd/drills and sets it; or set DRILL_CMD)');
  }
  return [bin, '--outputs', __ENV.STACK_OUTPUTS, '--root', __ENV.EDGEGUARD_ROOT || '.', ...args];
};
let drillArgv;
if (__ENV.DRILL_CMD) {
  drillArgv = ['sh', '-c', __ENV.DRILL_CMD];
} else if (DRILL === 'kill-master') {
  drillArgv = drillsTool(DRILL_REGION ? ['kill-master', DRILL_REGION] : ['kill-master']);
} else if (DRILL === 'drain') {
  if (!DRILL_REGION) {
    throw new Error('DRILL=drain needs DRILL_REGION (the region whose edges are drained)');
  }
  drillArgv = drillsTool(['drain', DRILL_REGION]);
} else {
  throw new Error(`DRILL=${DRILL}: want kill-master or drain (or set DRILL_CMD)`);
}
let recoverArgv = null;
if (__ENV.RECOVER_CMD) {
  recoverArgv = ['sh', '-c', __ENV.RECOVER_CMD];
} else if (!__ENV.DRILL_CMD && RECOVER === 'restore') {
  recoverArgv = drillsTool(['restore']);
} else if (RECOVER !== 'restore' && RECOVER !== 'none') {
  throw new Error(`RECOVER=${RECOVER}: want restore or none (or set RECOVER_CMD)`);
}
const seconds = (d) => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(d);
  if (!m) {
    throw new Error(`${d}: want a duration like 500ms, 20s or 2m`);
  }
  return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60 }[m[2]];
};
const DRILL_AT = __ENV.DRILL_AT || '20s';
const RECOVER_AFTER = seconds(__ENV.RECOVER_AFTER || '15s');
const DURING = seconds(__ENV.DURING || '15s');

const checker = eg.checker({ rulesFile: rulesPath(stack), settle: '7s' });
const population = eg.population({
  size: parseInt(__ENV.CLIENTS || '500', 10), seed: 2,
  distribution: 'zipf', zipfS: 1.2, ipv6Share: 0.25, roamingShare: 0.1,
});

const scenarios = {
  drill: {
    executor: 'shared-iterations', vus: 1, iterations: 1,
    startTime: DRILL_AT, maxDuration: DURATION, exec: 'drill', tags: { phase: 'drill' },
  },
};
for (const region of stack.regionNames) {
  scenarios[`traffic_${region.replace(/[^A-Za-z0-9_]/g, '_')}`] = {
    executor: 'constant-arrival-rate', rate: RATE, timeUnit: '1s', duration: DURATION,
    preAllocatedVUs: Math.max(4, Math.ceil(RATE / 4)), maxVUs: Math.max(20, RATE * 4),
    exec: 'traffic', env: { HOME_REGION: region }, tags: { home_region: region },
  };
}

const thresholds = {
  edgeguard_checked_responses: ['count>0'],
  edgeguard_ratelimit_malformed: ['count==0'],
  edgeguard_policy_mismatches: ['count==0'],
  'edgeguard_server{figure:drill_exit_code}': ['value==0'],
};
for (const [phase, strict] of [['before', true], ['during', false], ['after', true]]) {
  thresholds[`http_req_failed{phase:${phase}}`] = [strict ? 'rate<0.01' : 'rate>=0'];
  for (const m of ['edgeguard_over_admissions', 'edgeguard_false_denials', 'edgeguard_broken_retry_promises']) {
    thresholds[`${m}{phase:${phase}}`] = [strict ? 'count==0' : 'count>=0'];
  }
}

const SETTLE_TIMEOUT = seconds(__ENV.SETTLE_TIMEOUT || '3m');

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  setupTimeout: `${Math.ceil(SETTLE_TIMEOUT) + 60}s`,
  teardownTimeout: '60s',
};

function phase() {
  const m = eg.marks();
  if (!m.drill_start) {
    return 'before';
  }
  if (recoverArgv) {
    return m.recover_end ? 'after' : 'during';
  }
  return m.drill_end && eg.now() >= m.drill_end + DURING * 1000 ? 'after' : 'during';
}

// An edge still shedding from an earlier overload (the ramp recovers over
// minutes) would fail requests before the drill; setup waits for every
// edge's shed level to be back at or below zero.
function shedding() {
  const levels = eg.scrapeValues(adminURLs(stack), 'edgeguard_shedder_level');
  return Object.keys(levels).filter((u) => levels[u] > 0).map((u) => `${u} ${levels[u].toFixed(2)}`);
}

export function setup() {
  const deadline = Date.now() + SETTLE_TIMEOUT * 1000;
  for (let busy = shedding(); busy.length > 0; busy = shedding()) {
    if (Date.now() > deadline) {
      throw new Error(`edges still shedding after ${SETTLE_TIMEOUT} s (level > 0): ${busy.join(', ')}`);
    }
    console.warn(`waiting for edges to stop shedding: ${busy.join(', ')}`);
    sleep(5);
  }
  eg.scrape('start', adminURLs(stack));
}

export function traffic() {
  const region = __ENV.HOME_REGION;
  const client = pickClient(stack, population, region);
  const p = phase();
  const edge = pickEdge(stack, region);
  if (!edge) {
    check(null, { 'DNS answered an edge': () => false }, { phase: p });
    return;
  }
  const res = send(checker, client, edge, { path: REQ_PATH, tags: { phase: p }, checkTags: { phase: p } });
  check(res, { 'answered 2xx or 429': (r) => (r.status >= 200 && r.status < 300) || r.status === 429 }, { phase: p });
}

// The stack's tooling prints its event as a JSON line (what it hit, when
// the stack showed the event took effect); a shell command may print
// anything.
function eventOf(output) {
  const lines = output.trim().split('\n').filter((l) => l.startsWith('{'));
  if (lines.length === 0) {
    return null;
  }
  try {
    return JSON.parse(lines[lines.length - 1]);
  } catch (e) {
    return null;
  }
}

export function drill() {
  const r = eg.run('drill', drillArgv);
  eg.gauge('drill_exit_code', r.code);
  if (r.code !== 0) {
    console.error(`drill ${drillArgv.join(' ')} exited ${r.code}: ${r.output}`);
  }
  const ev = eventOf(r.output);
  if (ev && ev.witnessed) {
    eg.markAt('drill_witnessed', Date.parse(ev.witnessed));
    eg.gauge('drill_witnessed_after_seconds', ev.took_seconds);
    console.log(`drill: ${ev.event} ${ev.region || ''} ${ev.target || ''}${ev.promoted ? ` -> ${ev.promoted}` : ''}: witnessed after ${ev.took_seconds.toFixed(3)} s`);
  }
  if (recoverArgv) {
    sleep(RECOVER_AFTER);
    const rr = eg.run('recover', recoverArgv);
    eg.gauge('recover_exit_code', rr.code);
    if (rr.code !== 0) {
      console.error(`recovery ${recoverArgv.join(' ')} exited ${rr.code}: ${rr.output}`);
    }
  }
}

export function teardown() {
  checker.finish();
  eg.scrape('end', adminURLs(stack));
  eg.serverDelta('start', 'end');
}

export function handleSummary(data) {
  const split = {};
  for (const p of ['before', 'during', 'after']) {
    const v = (name, field) => (data.metrics[`${name}{phase:${p}}`] ? data.metrics[`${name}{phase:${p}}`].values[field] : null);
    split[p] = {
      failed: v('http_req_failed', 'rate'),
      over_admissions: v('edgeguard_over_admissions', 'count'),
      false_denials: v('edgeguard_false_denials', 'count'),
      broken_promises: v('edgeguard_broken_retry_promises', 'count'),
    };
  }
  const marks = eg.marks();
  const t0 = Math.min(...Object.values(marks));
  const rel = {};
  for (const [k, v] of Object.entries(marks)) {
    rel[k] = new Date(v).toISOString();
  }
  return finish('failover', data, checker, {
    drill: drillArgv.join(' '), recover: recoverArgv ? recoverArgv.join(' ') : null, marks: rel, phases: split, t0,
  });
}
