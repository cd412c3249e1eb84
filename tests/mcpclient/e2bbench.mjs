// Times the same create → run → kill loop two ways against one server,
// interleaved in one run (issue 24):
//
//   A, e2b:  E2B's official SDK (`e2b`, pinned in package.json, unmodified):
//            Sandbox.create() → sbx.commands.run('echo 1') → sbx.kill()
//   B, own:  our own API with plain fetch: POST /v1/sandboxes →
//            POST /v1/sandboxes/{id}/commands {"cmd":"echo 1"} →
//            DELETE /v1/sandboxes/{id}
//
//   E2B_API_URL=<base>/e2b E2B_SANDBOX_URL=<base>/e2b E2B_API_KEY=<key> \
//   [KUBO_API_URL=<base>] [KUBO_API_KEY=<key>] node e2bbench.mjs [N] [W]
//
// N measured rounds (default 20) after W unmeasured warm-up rounds
// (default 3); a round is one A loop and one B loop, in alternating order
// so that a busy moment of a shared machine lands on both alike. Each
// step is timed on its own. KUBO_API_URL defaults to E2B_API_URL without
// its /e2b. Each key may be a comma-separated list, used in turn one per
// round, so that long runs stay under a plan's requests per minute.
//
// Prints one JSON object: p50 and p95 (nearest rank, ms) of each loop and
// step, and A/B of the p50s. A round whose output is not "1\n" counts as
// an error, not a sample; the script exits 1 if any round failed.
import { readFileSync } from 'node:fs';
import { Sandbox } from 'e2b';

const rounds = intArg(process.argv[2], 20, 1);
const warmup = intArg(process.argv[3], 3, 0);
const e2bURL = process.env.E2B_API_URL;
if (!e2bURL || !process.env.E2B_SANDBOX_URL || !process.env.E2B_API_KEY) {
  console.error('usage: E2B_API_URL=<base>/e2b E2B_SANDBOX_URL=<base>/e2b E2B_API_KEY=<key> node e2bbench.mjs [N] [W]');
  process.exit(2);
}
const kuboURL = (process.env.KUBO_API_URL || e2bURL.replace(/\/e2b\/?$/, '')).replace(/\/$/, '');
const e2bKeys = process.env.E2B_API_KEY.split(',');
const kuboKeys = (process.env.KUBO_API_KEY || process.env.E2B_API_KEY).split(',');

function intArg(s, def, least) {
  if (s === undefined) return def;
  const n = Number(s);
  if (!Number.isInteger(n) || n < least) {
    console.error(`not a whole number of at least ${least}: ${s}`);
    process.exit(2);
  }
  return n;
}

const steps = ['create', 'run', 'kill'];

// timed runs the steps of one loop in order, each timed, and always ends
// the sandbox if a step after create failed.
async function timed(impl, key) {
  const ms = {};
  let handle;
  try {
    for (const step of steps) {
      const t0 = performance.now();
      handle = await impl[step](key, handle);
      ms[step] = performance.now() - t0;
    }
  } catch (err) {
    if (handle !== undefined && ms.kill === undefined) await impl.kill(key, handle).catch(() => {});
    throw err;
  }
  ms.total = ms.create + ms.run + ms.kill;
  return ms;
}

// A: E2B's SDK, with its defaults.
const e2b = {
  create: (key) => Sandbox.create({ apiKey: key }),
  run: async (_key, sbx) => {
    const r = await sbx.commands.run('echo 1');
    if (r.exitCode !== 0 || r.stdout !== '1\n') throw new Error(`e2b run: exit ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`);
    return sbx;
  },
  kill: async (_key, sbx) => {
    if ((await sbx.kill()) !== true) throw new Error(`e2b kill of ${sbx.sandboxId}: not found`);
    return sbx;
  },
};

// B: our own API, plain fetch (undici's keep-alive, as the SDK has).
async function call(key, method, path, body) {
  const res = await fetch(kuboURL + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: HTTP ${res.status}: ${text}`);
  return text ? JSON.parse(text) : undefined;
}
const own = {
  create: async (key) => (await call(key, 'POST', '/v1/sandboxes', {})).id,
  run: async (key, id) => {
    const r = await call(key, 'POST', `/v1/sandboxes/${id}/commands`, { cmd: 'echo 1' });
    if (r.exit_code !== 0 || r.stdout !== '1\n') throw new Error(`own run: exit ${r.exit_code}, stdout ${JSON.stringify(r.stdout)}`);
    return id;
  },
  kill: async (key, id) => {
    await call(key, 'DELETE', `/v1/sandboxes/${id}`);
    return id;
  },
};

const loops = { e2b: { impl: e2b, keys: e2bKeys }, own: { impl: own, keys: kuboKeys } };
const samples = { e2b: [], own: [] };
const errors = { e2b: [], own: [] };
const began = Date.now();
for (let i = 0; i < warmup + rounds; i++) {
  const order = i % 2 === 0 ? ['e2b', 'own'] : ['own', 'e2b'];
  for (const name of order) {
    const { impl, keys } = loops[name];
    try {
      const ms = await timed(impl, keys[i % keys.length]);
      if (i >= warmup) samples[name].push(ms);
    } catch (err) {
      errors[name].push(`round ${i + 1 - warmup}: ${err?.message ?? err}`);
    }
  }
}

// Nearest rank, as vertal bench computes it.
function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const rank = Math.min(Math.max(Math.ceil((p / 100) * sorted.length - 1e-9), 1), sorted.length);
  return sorted[rank - 1];
}
const round2 = (x) => (x === null ? null : Math.round(x * 100) / 100);
function summary(name) {
  const out = { n: samples[name].length, errors: errors[name].length };
  for (const part of ['total', ...steps]) {
    const sorted = samples[name].map((s) => s[part]).sort((a, b) => a - b);
    out[part] = { p50_ms: round2(percentile(sorted, 50)), p95_ms: round2(percentile(sorted, 95)) };
  }
  if (errors[name].length) out.first_error = errors[name][0];
  return out;
}
const result = {
  rounds,
  warmup,
  node: process.version,
  e2b_sdk: JSON.parse(readFileSync(new URL('./node_modules/e2b/package.json', import.meta.url))).version,
  seconds: round2((Date.now() - began) / 1000),
  loops: { e2b: summary('e2b'), own: summary('own') },
  ratio_p50: {},
};
for (const part of ['total', ...steps]) {
  const a = result.loops.e2b[part].p50_ms;
  const b = result.loops.own[part].p50_ms;
  result.ratio_p50[part] = a === null || b === null || b === 0 ? null : round2(a / b);
}
console.log(JSON.stringify(result));
if (errors.e2b.length || errors.own.length) {
  for (const name of ['e2b', 'own']) for (const e of errors[name]) console.error(`${name}: ${e}`);
  process.exit(1);
}
