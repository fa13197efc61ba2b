// failover.js: steady multi-region traffic while a drill runs at a marked
// time: the stack's tooling kills a Redis master or drains a region
// (DRILL_CMD, a shell command), optionally undone later (RECOVER_CMD). The
// scenario itself runs the commands and records their timestamps, then
// splits errors and checker findings before / during / after.
//
//   make loadtest SCENARIO=failover DRILL_CMD='…kill a master…' [RECOVER_CMD='…'] \
//        [DRILL_AT=20s] [RECOVER_AFTER=15s] [DURING=15s] [DURATION=75s] [RATE=30]
//
// "during" runs from the drill's start to the end of RECOVER_CMD, or, with
// no RECOVER_CMD, to DURING after the drill command returned (a Redis
// failover the stack heals by itself). Thresholds hold before and after;
// during is reported (the fallback is approximate by design).
import { check, sleep } from 'k6';
import eg from 'k6/x/edgeguard';
import { adminURLs, finish, loadStack, pickEdge, rulesPath, send } from './lib/stack.js';

const stack = loadStack();
const RATE = parseInt(__ENV.RATE || '30', 10);
// The stack's exact rule by default (sliding_log 20 per client per 2 s), so
// over-admission during the failover has decisions to be judged on.
const REQ_PATH = __ENV.REQ_PATH || '/drill/exact';
const DURATION = __ENV.DURATION || '75s';
const DRILL_CMD = __ENV.DRILL_CMD || '';
const RECOVER_CMD = __ENV.RECOVER_CMD || '';
if (!DRILL_CMD) {
  throw new Error('set DRILL_CMD: the shell command of the drill (e.g. the stack tooling that kills a Redis master)');
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

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  teardownTimeout: '60s',
};

function phase() {
  const m = eg.marks();
  if (!m.drill_start) {
    return 'before';
  }
  if (RECOVER_CMD) {
    return m.recover_end ? 'after' : 'during';
  }
  return m.drill_end && eg.now() >= m.drill_end + DURING * 1000 ? 'after' : 'during';
}

function homeOf(client) {
  return stack.regionNames[client.id % stack.regionNames.length];
}

export function setup() {
  eg.scrape('start', adminURLs(stack));
}

export function traffic() {
  const region = __ENV.HOME_REGION;
  let client = population.pick();
  for (let i = 0; i < 20 && !client.roaming && homeOf(client) !== region; i++) {
    client = population.pick();
  }
  const p = phase();
  const edge = pickEdge(stack, region);
  if (!edge) {
    check(null, { 'DNS answered an edge': () => false }, { phase: p });
    return;
  }
  const res = send(checker, client, edge, { path: REQ_PATH, tags: { phase: p }, checkTags: { phase: p } });
  check(res, { 'answered 2xx or 429': (r) => (r.status >= 200 && r.status < 300) || r.status === 429 }, { phase: p });
}

export function drill() {
  const r = eg.run('drill', ['sh', '-c', DRILL_CMD]);
  eg.gauge('drill_exit_code', r.code);
  if (r.code !== 0) {
    console.error(`drill command exited ${r.code}: ${r.output}`);
  }
  if (RECOVER_CMD) {
    sleep(RECOVER_AFTER);
    const rr = eg.run('recover', ['sh', '-c', RECOVER_CMD]);
    eg.gauge('recover_exit_code', rr.code);
    if (rr.code !== 0) {
      console.error(`recover command exited ${rr.code}: ${rr.output}`);
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
  return finish('failover', data, checker, { drill: DRILL_CMD, recover: RECOVER_CMD || null, marks: rel, phases: split, t0 });
}
