// Shared by the scenarios: the stack's outputs, edge selection (DNS or the
// outputs), one checked request, and the end-of-test files.
import http from 'k6/http';
import eg from 'k6/x/edgeguard';

// Outputs of the multi-region stack: `terraform output -json` or
// .stack/outputs.json (each value possibly wrapped as {value, type}).
// make loadtest passes the absolute path in STACK_OUTPUTS.
export function loadStack() {
  const path = __ENV.STACK_OUTPUTS;
  if (!path) {
    throw new Error('STACK_OUTPUTS is not set (make loadtest sets it; or point it at .stack/outputs.json)');
  }
  const raw = JSON.parse(open(path));
  const out = {};
  for (const k of Object.keys(raw)) {
    const v = raw[k];
    out[k] = v && typeof v === 'object' && 'value' in v && 'type' in v ? v.value : v;
  }
  if (!out.regions || Object.keys(out.regions).length === 0) {
    throw new Error(`${path}: no regions in the stack outputs`);
  }
  const regions = {};
  const byAddr = {};
  for (const name of Object.keys(out.regions).sort()) {
    const r = out.regions[name];
    const edges = [];
    for (const pop of Object.keys(r.pops || {}).sort()) {
      for (const e of r.pops[pop].edges || []) {
        const edge = Object.assign({}, e, { pop, region: name });
        edges.push(edge);
        byAddr[e.addr] = edge;
      }
    }
    if (edges.length === 0) {
      throw new Error(`${path}: region ${name} has no edges`);
    }
    regions[name] = Object.assign({}, r, { name, edges });
  }
  const root = __ENV.EDGEGUARD_ROOT || '.';
  return {
    regions,
    regionNames: Object.keys(regions),
    byAddr,
    allEdges: Object.values(byAddr),
    dnsQuery: out.dns_query || 'edge',
    rulesFile: __ENV.RULES_FILE || (!out.rules_file ? '' : out.rules_file.startsWith('/') ? out.rules_file : `${root}/${out.rules_file}`),
    prometheusURL: out.prometheus_url || '',
    stateDir: out.state_dir || '',
    useDNS: (__ENV.DNS || '1') !== '0',
  };
}

// rulesPath resolves the outputs' rules_file (relative to the repo root).
export function rulesPath(stack) {
  if (!stack.rulesFile) {
    throw new Error('the stack outputs have no rules_file and RULES_FILE is not set');
  }
  return stack.rulesFile;
}

// homeOf is a non-roaming client's one home region (by id).
export function homeOf(stack, client) {
  return stack.regionNames[client.id % stack.regionNames.length];
}

// pickClient draws a client of region's scenario from population: one whose
// home is region, or a roaming one (which is sent to any region).
export function pickClient(stack, population, region) {
  let client = population.pick();
  for (let i = 0; i < 20 && !client.roaming && homeOf(stack, client) !== region; i++) {
    client = population.pick();
  }
  return client;
}

// pickEdge follows DNS like a client would: the region's Consul DNS answers
// edge.query.consul with its healthy edges (or, failing over, another
// region's). Without a DNS address (or with DNS=0) it picks among the
// region's edges from the outputs.
export function pickEdge(stack, region) {
  const r = stack.regions[region];
  if (stack.useDNS && r.consul && r.consul.dns) {
    const addrs = eg.resolve(r.consul.dns, `${stack.dnsQuery}.query.consul`);
    if (addrs.length === 0) {
      return null;
    }
    const addr = addrs[Math.floor(Math.random() * addrs.length)];
    const edge = stack.byAddr[addr];
    if (!edge) {
      throw new Error(`DNS of ${region} answered ${addr}, which no edge in the outputs has`);
    }
    return edge;
  }
  return r.edges[Math.floor(Math.random() * r.edges.length)];
}

// 429 is an answer, not a failure: http_req_failed counts only the rest.
http.setResponseCallback(http.expectedStatuses({ min: 200, max: 399 }, 429));

// send makes one request of client through edge and feeds the checker.
// extra: {path, method, headers, tags (request tags), checkTags (finding tags)}.
export function send(checker, client, edge, extra) {
  const x = extra || {};
  const headers = Object.assign({}, client.headers, x.headers || {});
  const path = x.path || '/';
  const tags = Object.assign({ region: edge.region, pop: edge.pop, name: path }, x.tags || {});
  const sent = eg.now();
  const res = http.request(x.method || 'GET', `${edge.url}${path}`, null, { headers, tags, timeout: __ENV.REQUEST_TIMEOUT || '5s' });
  const received = eg.now();
  checker.record(client.id, res, { sent, received, region: edge.region, pop: edge.pop, tags: x.checkTags || {} });
  return res;
}

export function adminURLs(stack) {
  return stack.allEdges.map((e) => `${e.admin}/metrics`);
}

// The correctness thresholds every scenario carries (and the CI smoke runs
// alone): no transport errors beyond 1%, no limiter error found, every
// response's fields readable, the edges running the rules the checker read.
export function correctnessThresholds() {
  return {
    http_req_failed: ['rate<0.01'],
    edgeguard_over_admissions: ['count==0'],
    edgeguard_false_denials: ['count==0'],
    edgeguard_broken_retry_promises: ['count==0'],
    edgeguard_ratelimit_malformed: ['count==0'],
    edgeguard_policy_mismatches: ['count==0'],
    edgeguard_checked_responses: ['count>0'],
  };
}

function metricValue(data, name, field) {
  const m = data.metrics[name];
  if (!m || !m.values) {
    return null;
  }
  return m.values[field] === undefined ? null : m.values[field];
}

function fmt(v, digits) {
  if (v === null || v === undefined) {
    return '-';
  }
  return typeof v === 'number' ? v.toFixed(digits === undefined ? 2 : digits) : String(v);
}

// finish writes <scenario>-<time>.json under the results directory (the
// k6 summary data, the checker's findings and stats, the server-side
// deltas, anything extra) and prints a short edgeguard block; it returns
// null so k6 still prints its own end-of-test summary.
export function finish(name, data, checker, extra) {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const acc = checker.summary();
  const server = eg.serverReport();
  const doc = { scenario: name, finished: new Date().toISOString(), edgeguard: { checker: acc, server, extra: extra || {} }, k6: data };
  const path = eg.writeResult(`${name}-${stamp}.json`, JSON.stringify(doc, null, 2));
  const lines = [
    '',
    `edgeguard ${name}: results in ${path}`,
    `  requests ${fmt(metricValue(data, 'http_reqs', 'count'), 0)} (${fmt(metricValue(data, 'http_reqs', 'rate'), 1)}/s), ` +
      `failed ${fmt(100 * (metricValue(data, 'http_req_failed', 'rate') || 0), 3)}%, ` +
      `p99 ${fmt(metricValue(data, 'http_req_duration', 'p(99)'))} ms`,
    `  checker: ${acc.stats.events} responses, ${acc.stats.admissions} admissions, ${acc.stats.denials} denials; ` +
      `over-admission ${acc.stats.findings.over_admission}, false denials ${acc.stats.findings.false_denial}, ` +
      `broken retry promises ${acc.stats.findings.broken_promise} ` +
      `(${acc.stats.checked_count_decisions} count decisions judged, ${acc.stats.promises_tested} retry promises tested; ` +
      `${acc.stats.unknown} unknown, ${acc.stats.late_events} late)`,
  ];
  for (const p of acc.policies) {
    lines.push(`    ${p.name}: ${p.algorithm} q=${p.q}/${p.window} per ${p.scope}, checks: ${p.checks.join(', ') || 'none (not keyed on the client alone, or shadow)'}`);
    const ps = (acc.stats.by_policy || {})[p.name];
    if (ps) {
      lines.push(`      most admitted in one window ${ps.most_in_window} (bound ${p.bound}); judged ${ps.admissions_judged} admissions, ${ps.denials_judged} denials; ` +
        `over-admission ${ps.findings.over_admission}, false denials ${ps.findings.false_denial}`);
    }
  }
  if (server) {
    const d = server.deltas || {};
    const show = (k) => (d[k] ? Object.entries(d[k]).map(([g, v]) => `${g || 'total'}=${v}`).join(' ') : 'n/a');
    lines.push(`  edges: requests ${show('requests')}; fallback ${show('fallback')}; script calls/request ${fmt(server.script_calls_per_request, 3)}`);
    lines.push(`         shed by tier ${show('shed_by_tier')}; shed (ramp) ${show('shed_ramp')}`);
    if (server.missing && server.missing.length) {
      lines.push(`         not exported by these edges: ${server.missing.join(', ')}`);
    }
  }
  for (const [k, v] of Object.entries(extra || {})) {
    lines.push(`  ${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`);
  }
  for (const kind of ['over_admission', 'false_denial', 'broken_promise']) {
    const f = acc.findings.find((x) => x.kind === kind);
    if (f) {
      const tags = Object.entries(f.tags || {}).map(([k, v]) => `${k}=${v}`).join(' ');
      lines.push(`  first ${kind}: ${f.policy} ${f.region}${f.pop ? '/' + f.pop : ''} client ${f.client} ${tags}: ${f.detail}`);
    }
  }
  eg.print(lines.join('\n'));
  return null;
}
