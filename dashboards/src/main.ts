// Writes every board as dashboards/<uid>.json, or with --check verifies the
// committed files are what the code generates (make test runs the check).
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { rateLimitsBoard } from './ratelimits';
import { regionsBoard } from './regions';
import { shedderBoard } from './shedder';

const boards: dashboard.Dashboard[] = [shedderBoard(), rateLimitsBoard(), regionsBoard()];
const dir = join(__dirname, '..');
const check = process.argv.includes('--check');

let stale = 0;
for (const b of boards) {
  // Panel ids must be unique and stable: number them in order.
  let id = 1;
  for (const p of b.panels ?? []) {
    p.id = id++;
  }
  const file = join(dir, `${b.uid}.json`);
  const text = JSON.stringify(b, null, 2) + '\n';
  if (!check) {
    writeFileSync(file, text);
    console.log(`wrote ${file}`);
    continue;
  }
  let have = '';
  try {
    have = readFileSync(file, 'utf8');
  } catch {
    // missing counts as stale
  }
  if (have !== text) {
    console.error(`${b.uid}.json is not what src/ generates: run "npm run generate" in dashboards/ and commit the result`);
    stale++;
  }
}
if (stale > 0) {
  process.exit(1);
}
